"""`macbatch run --replicas 2` on two ranks (ring backend, 127.0.0.1): each rank runs the whole
model on its share of the rows, rank 0 writes every line once, and a replica killed mid-run costs
only its unfinished rows. The oracle is the same job run by one process, re-read from its files.
Every subprocess has a deadline, so nothing here can hang CI."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from macbatch.batch.paths import LEDGER_NAME
from tests.support.job_files import read_jsonl
from tests.support.ranks import mlx_launch, spawn_ranks, stop_all
from tests.support.rows_job import write_rows_job

ROWS = 24
REPLICAS = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    """A job of ROWS greedy rows, long enough (32 tokens each, two sequences per step) that a
    replica can be killed while it still holds some."""
    return write_rows_job(tmp_path_factory.mktemp("replicas"), tiny_model_path, ROWS, 32)


@pytest.fixture(scope="module")
def one_process(job: Path, run_app) -> dict[str, str]:
    """Each row's reply when one process runs the job."""
    from typer.testing import CliRunner

    out = job.parent / "one"
    result = CliRunner().invoke(run_app, [str(job), "--headless", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return _replies(out)


def _replicas_command(job: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "macbatch", "run", str(job), "--headless", "-o", str(out)] + [
        "--replicas",
        str(REPLICAS),
        "--max-seqs",
        "2",
    ]


def _replies(out: Path) -> dict[str, str]:
    """custom_id -> reply, after checking that every row has exactly one line and the ledger
    holds each once."""
    lines = read_jsonl(out / "rows.jsonl")
    assert Counter(line["custom_id"] for line in lines) == {f"r{i}": 1 for i in range(ROWS)}
    with sqlite3.connect(out / LEDGER_NAME) as db:
        assert db.execute("SELECT COUNT(*) FROM done WHERE job='rows'").fetchone() == (ROWS,)
    return {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in lines
    }


def test_two_replicas_write_what_one_process_writes(job: Path, one_process: dict) -> None:
    """Under `mlx.launch -n 2`, both replicas answer rows, every row is written once, and every
    greedy reply is the one a single process gives."""
    out = job.parent / "two"
    launched = mlx_launch(_replicas_command(job, out), ranks=REPLICAS, timeout_s=300)
    assert (out / "summary.json").exists(), launched.stdout + launched.stderr
    assert _replies(out) == one_process
    summary = json.loads((out / "summary.json").read_text())
    replicas = summary["replicas"]
    assert [r["rank"] for r in replicas] == [0, 1], summary
    assert all(r["requests"] > 0 and r["generated_tokens"] > 0 for r in replicas), summary
    assert sum(r["requests"] for r in replicas) == ROWS
    assert sum(r["generated_tokens"] for r in replicas) == summary["generated_tokens"]


def test_a_killed_replica_costs_only_its_rows(job: Path, one_process: dict) -> None:
    """Rank 1 is SIGKILLed mid-run: rank 0 stops at once with the reason, every line finished
    before is kept, and the same command again writes the rest: every row once, identical to one
    process."""
    out = job.parent / "killed"
    output = out / "rows.jsonl"
    ranks = spawn_ranks(_replicas_command(job, out), REPLICAS, job.parent)
    try:
        deadline = time.monotonic() + 180
        while not (output.exists() and output.read_bytes().count(b"\n") >= 4):
            assert time.monotonic() < deadline and ranks[0].poll() is None, ranks[0].stderr.read()
            time.sleep(0.02)
        ranks[1].kill()
        _, stderr = ranks[0].communicate(timeout=60)
    finally:
        stop_all(ranks)
    assert ranks[0].returncode == 130, stderr.decode()  # interrupted: resumable
    assert "the replicas' exchange lost a rank" in stderr.decode(), stderr.decode()
    written = output.read_bytes().count(b"\n")
    assert 4 <= written < ROWS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["ok"] == written

    launched = mlx_launch(_replicas_command(job, out), ranks=REPLICAS, timeout_s=300)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == written and summary["ok"] == ROWS - written, launched.stderr
    assert _replies(out) == one_process


# Imported first by every Python process of the rank given it (PYTHONPATH): that rank cannot
# read any weights file, as on a Mac whose copy of the model is damaged.
UNREADABLE_WEIGHTS = """
import mlx.core as mx
_load = mx.load
def _refuse(path, *args, **kwargs):
    if str(path).endswith(".safetensors"):
        raise OSError(f"cannot read {path} on this rank")
    return _load(path, *args, **kwargs)
mx.load = _refuse
"""


def test_a_rank_that_cannot_load_stops_the_run_before_any_row(job: Path) -> None:
    """Rank 1 cannot read the weights: both ranks stop with rank 1's reason, and no row is
    handed out (no line written, no row in a ledger)."""
    broken = job.parent / "broken-rank"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(UNREADABLE_WEIGHTS)
    out = job.parent / "unloadable"
    ranks = spawn_ranks(
        _replicas_command(job, out), REPLICAS, job.parent, {1: {"PYTHONPATH": str(broken)}}
    )
    try:
        stderr = [rank.communicate(timeout=240)[1].decode() for rank in ranks]
    finally:
        stop_all(ranks)
    assert ranks[0].returncode != 0 and ranks[1].returncode != 0, stderr
    assert "on every replica, so nothing was run: rank 1" in stderr[0], stderr[0]
    assert "cannot read" in stderr[0] and "on this rank" in stderr[0], stderr[0]
    assert not (out / "rows.jsonl").exists() or not (out / "rows.jsonl").read_text()
    if (out / LEDGER_NAME).exists():
        with sqlite3.connect(out / LEDGER_NAME) as db:
            assert db.execute("SELECT COUNT(*) FROM done").fetchone() == (0,)


def test_replicas_without_as_many_ranks_are_refused_before_any_file(job: Path, run_app) -> None:
    """One process asked for two replicas: refused with the launch command that fits, and no
    output directory is made."""
    from typer.testing import CliRunner

    out = job.parent / "refused"
    result = CliRunner().invoke(run_app, [str(job), "-o", str(out), "--replicas", "2"])
    assert result.exit_code == 1
    assert "--replicas 2 needs 2 ranks" in result.output, result.output
    assert "mlx.launch -n 2 -- macbatch run ... --replicas 2" in result.output
    assert not out.exists()
