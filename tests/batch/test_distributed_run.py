"""`macbatch run` on two ranks (ring backend, 127.0.0.1) when one of them is lost mid-job: rank 0
stops with a clear error within seconds, and the rerun resumes from the ledger exactly once.
Every subprocess has a deadline, so nothing here can hang CI."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from macbatch.batch.paths import LEDGER_NAME
from macbatch.engine.distributed.watchdog import EXIT_PEER_TIMEOUT
from tests.support.job_files import read_jsonl
from tests.support.ranks import spawn_ranks, stop_all
from tests.support.rows_job import write_rows_job

ROWS = 24


@pytest.fixture
def rows_job(tmp_path: Path, tiny_model_path: Path) -> Path:
    return write_rows_job(tmp_path, tiny_model_path, ROWS, 8)


def _run_command(job: Path) -> list[str]:
    return [sys.executable, "-m", "macbatch", "run", str(job), "--headless", "--max-in-flight", "2"]


# How rank 0 learns of the loss: the ring backend raises when the peer's sockets close between
# collectives; when they close inside a step's forward, MLX waits forever and the watchdog ends it.
RAISED = (1, "connection to a peer was lost")
WATCHDOG = (EXIT_PEER_TIMEOUT, "another rank died or stopped answering")


@pytest.mark.parametrize(
    ("how", "outcomes"),
    [(signal.SIGKILL, [RAISED, WATCHDOG]), (signal.SIGSTOP, [WATCHDOG])],
    ids=["rank-killed", "rank-frozen"],
)
def test_a_lost_rank_stops_rank_zero_and_the_run_resumes(
    how: signal.Signals,
    outcomes: list[tuple[int, str]],
    rows_job: Path,
    macbatch_run,
) -> None:
    """Rank 1 is killed (its sockets close) or frozen (a host that stops answering) mid-job: rank
    0 exits within seconds with a clear error instead of hanging, and the same command resumes
    from the ledger with every row written exactly once (here on one rank: the ledger does not
    depend on how many ranks ran)."""
    output = rows_job.parent / "out" / "rows.jsonl"
    ranks = spawn_ranks(_run_command(rows_job), 2, rows_job.parent)
    try:
        deadline = time.monotonic() + 120
        while not (output.exists() and output.read_bytes().count(b"\n") >= 4):
            assert time.monotonic() < deadline and ranks[0].poll() is None, ranks[0].stderr.read()
            time.sleep(0.05)
        ranks[1].send_signal(how)
        lost_at = time.monotonic()
        _, stderr = ranks[0].communicate(timeout=30)
        waited = time.monotonic() - lost_at
    finally:
        stop_all(ranks)
    status, message = next((o for o in outcomes if o[0] == ranks[0].returncode), (None, None))
    assert status is not None and message in stderr.decode(), stderr.decode()
    assert waited < 40  # the default 10 s floor, stretched by this shared machine's load
    written = output.read_bytes().count(b"\n")
    assert 4 <= written < ROWS

    resumed = macbatch_run(rows_job, "--headless").output
    summary = json.loads((rows_job.parent / "out" / "summary.json").read_text())
    assert summary["skipped"] >= written and summary["skipped"] + summary["ok"] == ROWS, resumed
    lines = read_jsonl(output)
    assert Counter(x["custom_id"] for x in lines) == {f"r{i}": 1 for i in range(ROWS)}
    with sqlite3.connect(rows_job.parent / "out" / LEDGER_NAME) as db:
        assert db.execute("SELECT COUNT(*) FROM done WHERE job='rows'").fetchone() == (ROWS,)
