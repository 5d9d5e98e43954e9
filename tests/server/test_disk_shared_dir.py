"""``serve`` and ``run`` on one cache directory at once are safe: the same model in both is one
namespace, so while ``run`` writes its rows' blocks ``serve`` writes new prompts' blocks beside
them and both read the blocks the other wrote (the system prompt the rows share, the rows'
own questions that serve asks too). Afterwards every block file is whole (its checksum holds),
no temporary file is left, both gave the same greedy replies, and a rerun reads every row's
prompt back from the files."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import openai
import typer
from typer.testing import CliRunner

from macbatch.batch.command import run_command
from macbatch.engine.kv.disk.files import SUFFIX, decode
from tests.support.serve_process import start_server

SYSTEM = "You are the shared system prompt of two processes on one cache directory. " * 3
QUESTIONS = [f"Question {i}: which word comes after {i * 7} apples?" for i in range(10)]
BLOCK = 16  # tokens per KV block (EngineConfig's default)
MAX_TOKENS = 6


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _run(job: Path, *extra: str) -> dict[str, dict]:
    app = typer.Typer()
    app.command()(run_command)
    result = CliRunner().invoke(app, [str(job), "--headless", "--max-in-flight", "1", *extra])
    assert result.exit_code == 0, result.output
    lines = (job.parent / "out" / "ask.jsonl").read_text().splitlines()
    return {json.loads(x)["custom_id"]: json.loads(x) for x in lines}


def _ask_until(
    url: str, model: str, done: threading.Event, replies: dict[str, str], times: list[float]
) -> None:
    """Serve's side until ``done``: a new question (new blocks to write while run writes its
    own), then the rows' questions, last first; ``times``: when each reply came."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    while not done.is_set():
        for question in [f"{uuid.uuid4().hex} {SYSTEM}", *reversed(QUESTIONS)]:
            reply = client.chat.completions.create(
                model=model, messages=_messages(question), max_tokens=MAX_TOKENS, temperature=0
            )
            if question in QUESTIONS:
                replies[question] = reply.choices[0].message.content or ""
            times.append(time.monotonic())


def test_serve_and_run_share_a_cache_dir(tiny_model_path: Path, tmp_path: Path) -> None:
    cache, model = tmp_path / "kv", str(tiny_model_path)
    job = tmp_path / "jobs.yaml"
    job.write_text(
        f"model: {model}\n"
        f"defaults:\n  system: {json.dumps(SYSTEM)}\n"
        f"  sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}}}\n"
        "output: {dir: out}\n"
        f"jobs:\n  - name: ask\n    prompts: {json.dumps(QUESTIONS)}\n"
    )
    process, url = start_server(
        tiny_model_path, "--cache-dir", str(cache), env={"MACBATCH_HOME": str(tmp_path / "home")}
    )
    served: dict[str, str] = {}
    times: list[float] = []
    done = threading.Event()
    asking = threading.Thread(target=_ask_until, args=(url, model, done, served, times))
    try:
        asking.start()
        started = time.monotonic()
        lines = _run(job, "--cache-dir", str(cache))
        ended = time.monotonic()
        done.set()
        asking.join(timeout=120)
    finally:
        done.set()
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert any(started < t < ended for t in times), "serve answered nothing while run ran"
    ran = {QUESTIONS[int(key) - 1]: line for key, line in lines.items()}
    assert {q: _content(line) for q, line in ran.items()} == served

    namespaces = [p for p in cache.iterdir() if p.is_dir()]
    assert len(namespaces) == 1  # one model and format: both processes wrote the same files
    files = sorted(namespaces[0].glob(f"*/*{SUFFIX}"))
    for path in files:
        assert decode(bytes.fromhex(path.name[: -len(SUFFIX)]), path.read_bytes()) is not None
    assert not list(namespaces[0].glob("*/*.tmp"))

    again = _run(job, "--cache-dir", str(cache), "--fresh")
    for key, line in again.items():
        meta = line["macbatch"]
        assert meta["cached_tokens"] == (meta["prompt_tokens"] - 1) // BLOCK * BLOCK
        assert _content(line) == _content(lines[key])
    first = again["1"]["macbatch"]  # the rest find the system prompt in RAM
    assert first["disk_cached_tokens"] == first["cached_tokens"] > 0


def _content(line: dict) -> str:
    return line["response"]["body"]["choices"][0]["message"]["content"]
