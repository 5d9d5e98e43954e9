"""`run --fresh` starts over in every file (issue 65): the old table and summary go with the old
results, so a fresh run killed midway never leaves a summary saying "complete" or a CSV of the
old run's rows beside the new run's partial JSONL. Checked by re-reading the files."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.batch_process import start_run
from tests.support.job_files import read_jsonl, read_table
from tests.support.rows_job import write_rows_job

ROWS = 200


def consistent(out: Path) -> list[dict]:
    """The result lines, after checking that the table and the summary, where present, say what
    they say: a complete summary only beside every row's line, a table of exactly its rows."""
    lines = read_jsonl(out / "rows.jsonl") if (out / "rows.jsonl").exists() else []
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] != "complete" or len(lines) == ROWS, (summary, len(lines))
    if (out / "rows.csv").exists():
        replies = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"]
                   for x in lines}  # fmt: skip
        table = read_table(out / "rows.csv")
        assert {r["custom_id"]: r["reply"] for r in table if not r["error"]} == replies
    return lines


def wait_for_a_new_file(path: Path, process, count: int) -> int:
    """Lines of the fresh run's own output once it has `count` (the old file, of ROWS lines,
    goes first)."""
    while True:
        written = path.read_bytes().count(b"\n") if path.exists() else 0
        if count <= written < ROWS or process.poll() is not None:
            return written
        time.sleep(0.02)


def test_a_fresh_run_killed_midway_leaves_no_file_of_the_old_run(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    job_file = write_rows_job(tmp_path, tiny_model_path, ROWS, 8)
    out = tmp_path / "out"
    assert macbatch_run(job_file).exit_code == 0
    assert len(consistent(out)) == ROWS and len(read_table(out / "rows.csv")) == ROWS

    process = start_run(job_file, "--fresh")
    written = wait_for_a_new_file(out / "rows.jsonl", process, 10)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert 10 <= written < ROWS  # killed in the middle of the fresh run
    assert len(consistent(out)) < ROWS
    assert not (out / "summary.json").exists() and not (out / "rows.csv").exists()

    again = macbatch_run(job_file)  # resumes the fresh run: its files describe it whole
    assert again.exit_code == 0, again.output
    assert len(consistent(out)) == ROWS
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"
