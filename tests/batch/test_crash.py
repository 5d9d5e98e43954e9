"""A run killed in the middle (kill -9, or Ctrl-C) resumes to exactly-once output."""

from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from macbatch.batch.command import EXIT_INTERRUPTED
from macbatch.batch.paths import LEDGER_NAME
from tests.support.batch_process import kill_9_after, start_run, wait_for_lines
from tests.support.job_files import read_jsonl, write_job

ROWS = 200


def rows_job(directory: Path, model: Path, rows: int, max_tokens: int) -> Path:
    """A job summarizing `rows` rows greedily with `model`, up to `max_tokens` tokens each."""
    with (directory / "rows.jsonl").open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "text": f"row {i}: the quick brown fox"}) + "\n")
    return write_job(
        directory,
        f"""
        model: {model}
        jobs:
          - name: rows
            input: rows.jsonl
            template: "Summarize: {{text}}"
            sampling: {{temperature: 0, max_tokens: {max_tokens}}}
        """,
    )


@pytest.fixture
def job_file(tmp_path: Path, tiny_model_path: Path) -> Path:
    return rows_job(tmp_path, tiny_model_path, ROWS, 16)


def assert_exactly_once(job_file: Path) -> list[dict]:
    out = job_file.parent / "out"
    lines = read_jsonl(out / "rows.jsonl")
    assert Counter(x["custom_id"] for x in lines) == {f"r{i}": 1 for i in range(ROWS)}
    with sqlite3.connect(out / LEDGER_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        keys = [k for (k,) in db.execute("SELECT key FROM done WHERE job='rows'")]
    assert sorted(keys) == sorted(x["macbatch"]["key"] for x in lines)
    return lines


def test_kill_9_then_rerun_gives_every_request_once(job_file: Path, macbatch_run) -> None:
    output = job_file.parent / "out" / "rows.jsonl"
    written = kill_9_after(job_file, output, 20)
    assert 20 <= written < ROWS

    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    assert_exactly_once(job_file)
    summary = json.loads((job_file.parent / "out" / "summary.json").read_text())
    assert summary["skipped"] >= written and summary["skipped"] + summary["ok"] == ROWS


@pytest.mark.parametrize("presses", [1, 2], ids=["finish-in-flight", "stop-now"])
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(
    job_file: Path, macbatch_run, presses: int
) -> None:
    """Once: stop admitting, finish what is in flight. Twice: drop it. Either way whole lines."""
    elsewhere = job_file.parent / "elsewhere"
    output = elsewhere / "rows.jsonl"
    process = start_run(job_file, "-o", str(elsewhere))
    wait_for_lines(output, process, 10)
    for _ in range(presses):
        process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    events = [json.loads(line) for line in stderr.decode().splitlines()]
    notes = [e["message"] for e in events if e["event"] == "note"]
    assert any(n.startswith("Stopping: no new requests; finishing") for n in notes)
    hint = next(n for n in notes if "run the same command again to resume: " in n)
    summary = [e for e in events if e["event"] == "summary"][0]
    assert summary["status"] == "interrupted" and summary["remaining"] > 0
    lines = read_jsonl(output)
    assert len(lines) == summary["ok"]

    # The hint is the exact command: run as printed, it resumes into the same directory.
    program, command, *args = shlex.split(hint.split("to resume: ", 1)[1])
    assert (program, command, args) == (
        "macbatch",
        "run",
        [str(job_file), "-o", str(elsewhere), "--max-in-flight", "2", "--headless"],
    )
    result = macbatch_run(*args)
    assert result.exit_code == 0, result.output
    assert f"resuming: {len(lines)} of {ROWS} requests done before" in result.output
    assert read_jsonl(output)[: len(lines)] == lines
    lines = read_jsonl(output)
    assert Counter(x["custom_id"] for x in lines) == {f"r{i}": 1 for i in range(ROWS)}


def test_a_late_ctrl_c_reports_what_happened(tmp_path: Path, tiny_model_path: Path) -> None:
    """Ctrl-C while rows are in flight, and again once the summary is written (issue 50): the
    run finishes the rows in flight and says so, and its exit status agrees with summary.json
    and the lines on disk. Once the five one-token rows are written, the 400-token rows admitted
    with them are still running however loaded the machine is (the rows the Ctrl-C found not
    yet admitted stay for a rerun: their count is the summary's ``remaining``)."""
    for name, count in (("short", 5), ("long", 45)):
        with (tmp_path / f"{name}.jsonl").open("w") as f:
            for i in range(count):
                f.write(json.dumps({"id": f"{name}{i}", "text": f"row {i}: the quick fox"}) + "\n")
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: long
            input: long.jsonl
            template: "Summarize: {{text}}"
            sampling: {{temperature: 0, max_tokens: 400, ignore_eos: true}}
          - name: short
            input: short.jsonl
            template: "Summarize: {{text}}"
            sampling: {{temperature: 0, max_tokens: 1}}
        """,
    )
    out = tmp_path / "out"
    process = start_run(job_file, in_flight=50)
    wait_for_lines(out / "short.jsonl", process, 5)
    process.send_signal(signal.SIGINT)  # the rest are all in flight: they finish
    deadline = time.monotonic() + 120
    while not (out / "summary.json").exists() and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # a late one: everything is written
    _, stderr = process.communicate(timeout=60)
    events = [json.loads(line) for line in stderr.decode().splitlines()]
    assert not [e for e in events if e["event"] == "error"], events
    (summary,) = [e for e in events if e["event"] == "summary"]
    on_disk = json.loads((out / "summary.json").read_text())
    assert summary == {**on_disk, "event": "summary", "time": summary["time"]}
    written = len(read_jsonl(out / "short.jsonl")) + len(read_jsonl(out / "long.jsonl"))
    assert summary["ok"] == written and written + summary["remaining"] == 50
    complete = summary["remaining"] == 0
    assert summary["status"] == ("complete" if complete else "interrupted")
    assert process.returncode == (0 if complete else EXIT_INTERRUPTED)
    assert any(
        e["message"].startswith("Stopping: no new requests; finishing ")
        for e in events
        if e["event"] == "note"
    )
