"""A Batch API batch survives ``kill -9`` of ``macbatch serve``: restarted on the same data
directory, the server resumes it, and the output file holds each custom_id exactly once, with
the same replies as ``macbatch run`` of the same file (greedy, tiny model)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import openai
import typer
from typer.testing import CliRunner

from macbatch.batch.command import run_command
from tests.support.batch_api import DONE, batch_lines, jsonl, output_lines, wait_for
from tests.support.serve_process import start_server

ROWS = 600
MAX_TOKENS = 4


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _macbatch_run(model: Path, data: bytes, directory: Path) -> dict[str, dict]:
    """The oracle: ``macbatch run`` of the same OpenAI batch file, lines by custom_id."""
    (directory / "input.jsonl").write_bytes(data)
    job = directory / "jobs.yaml"
    job.write_text(f"model: {model}\njobs:\n  - name: rows\n    input: input.jsonl\n")
    app = typer.Typer()
    app.command()(run_command)
    result = CliRunner().invoke(app, [str(job), "--headless"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (directory / "out" / "rows.jsonl").read_text().splitlines()]
    return {line["custom_id"]: line for line in lines}


def _reply(line: dict) -> tuple:
    body = line["response"]["body"]
    usage = body["usage"]
    return body["choices"], usage["prompt_tokens"], usage["completion_tokens"]


def test_kill_9_mid_batch_then_restart(tiny_model_path: Path, tmp_path: Path) -> None:
    env = {"MACBATCH_HOME": str(tmp_path / "home")}
    data = jsonl(batch_lines(ROWS, MAX_TOKENS))
    process, url = start_server(tiny_model_path, env=env)
    try:
        client = _client(url)
        upload = client.files.create(file=("rows.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        seen = wait_for(client, batch.id, lambda b: b.request_counts.completed >= 150)
        process.kill()
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()  # type: ignore[union-attr]
    assert seen.request_counts.completed < ROWS, "the batch ended before the kill"
    process, url = start_server(tiny_model_path, env=env)
    try:
        client = _client(url)
        ended = wait_for(client, batch.id, lambda b: b.status in DONE, timeout=600)
        lines = output_lines(client, ended.output_file_id)
    finally:
        process.kill()
        process.wait(timeout=30)
        process.stderr.close()  # type: ignore[union-attr]
    assert ended.status == "completed", ended
    assert ended.request_counts.model_dump() == {"total": ROWS, "completed": ROWS, "failed": 0}
    assert Counter(line["custom_id"] for line in lines) == {f"r{i}": 1 for i in range(ROWS)}
    oracle = _macbatch_run(tiny_model_path, data, tmp_path)
    assert {line["custom_id"]: _reply(line) for line in lines} == {
        custom_id: _reply(line) for custom_id, line in oracle.items()
    }
