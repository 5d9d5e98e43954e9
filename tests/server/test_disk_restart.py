"""``serve``'s prefix cache survives a restart through the disk tier: a server started again on
the same cache directory reads a prompt it answered before from disk, reports those tokens in
every API's usage (chat completions, Messages and Responses, read through the official openai
and anthropic clients) and under ``tier="disk"`` in /metrics, with the bytes and blocks read,
and answers the same greedy reply.
The oracle for the counts is the files themselves (their number and sizes) and the prompt's
full 16-token blocks but the one holding its last token (the engine computes at least one).
The same holds for ``macbatch serve`` as a child process stopped with SIGTERM, and after
``kill -9`` once its block files are on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import openai

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.engine.kv.disk.files import HEADER_BYTES, SUFFIX
from tests.support.live_server import Served, serving
from tests.support.metrics_scrape import scrape
from tests.support.serve_process import start_server

WORDS = "the quick brown fox jumps over the lazy dog " * 14
BLOCK = 16  # tokens per KV block (EngineConfig's default)
TIER = 'macbatch_prefix_cache_tokens_total{{tier="{}"}}'
HITS = 'macbatch_prefix_cache_hits_total{{tier="{}"}}'


def _text() -> str:
    return f"{uuid.uuid4().hex} {WORDS}"


def _cacheable(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // BLOCK * BLOCK


def _block_files(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"*/*/*{SUFFIX}"))


@contextmanager
def _served(model: Path, cache: Path) -> Iterator[Served]:
    """A server over a fresh engine with the disk tier in ``cache``; the engine is shut down
    (its last blocks written) when the block ends."""
    config = EngineConfig(num_blocks=512, max_num_seqs=8, disk_cache_dir=str(cache))
    thread = EngineThread(lambda: Engine.load(str(model), config)).start()
    thread.wait_ready(timeout=120)
    try:
        with serving(thread) as served:
            yield served
    finally:
        thread.shutdown()


def _chat(url: str, model: str, text: str) -> tuple[str, int, int]:
    """(reply, cached, prompt tokens) of a greedy chat completion."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        temperature=0,
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return reply.choices[0].message.content or "", cached, usage.prompt_tokens


def _message(url: str, model: str, text: str) -> tuple[str, int, int]:
    """(reply, cached, prompt tokens) of a greedy Anthropic message."""
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    reply = client.messages.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        extra_body={"temperature": 0},  # this client version no longer names it
    )
    cached = reply.usage.cache_read_input_tokens or 0
    content = reply.content[0]
    assert content.type == "text"
    return content.text, cached, reply.usage.input_tokens + cached


def _response(url: str, model: str, text: str) -> tuple[str, int, int]:
    """(reply, cached, prompt tokens) of a greedy Responses API answer."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.responses.create(
        model=model, input=text, max_output_tokens=8, temperature=0, store=False
    )
    usage = reply.usage
    assert usage is not None
    return reply.output_text, usage.input_tokens_details.cached_tokens, usage.input_tokens


SENDERS = (_chat, _message, _response)


def test_a_restarted_server_reads_prompts_from_disk(tiny_model_path: Path, tmp_path: Path):
    """Each API's prompt, answered before the restart, is read from disk after it."""
    cache, model = tmp_path / "kv", str(tiny_model_path)
    texts = [_text() for _ in SENDERS]
    with _served(tiny_model_path, cache) as served:
        answers = [send(served.url, model, text) for send, text in zip(SENDERS, texts)]
        assert [cached for _, cached, _ in answers] == [0] * len(SENDERS)
        assert scrape(served)[TIER.format("disk")] == 0
    files = _block_files(cache)
    assert len(files) == sum(prompt // BLOCK for _, _, prompt in answers)
    payload = files[0].stat().st_size - HEADER_BYTES

    with _served(tiny_model_path, cache) as served:
        before = scrape(served)
        for send, text, (reply, _, prompt) in zip(SENDERS, texts, answers):
            assert send(served.url, model, text) == (reply, _cacheable(prompt), prompt)
        from_disk = scrape(served)
        again = _chat(served.url, model, texts[0])  # now in RAM
        after = scrape(served)
    read = sum(_cacheable(prompt) for _, _, prompt in answers)
    assert from_disk[TIER.format("disk")] - before[TIER.format("disk")] == read
    assert from_disk[HITS.format("disk")] - before[HITS.format("disk")] == len(SENDERS)
    assert from_disk[TIER.format("ram")] == before[TIER.format("ram")] == 0
    assert from_disk["macbatch_disk_cache_read_blocks_total"] == read // BLOCK
    assert from_disk["macbatch_disk_cache_read_bytes_total"] == read // BLOCK * payload
    assert from_disk["macbatch_disk_cache_written_blocks_total"] == 0  # all on disk already
    assert from_disk["macbatch_disk_cache_blocks"] == len(files)
    assert from_disk["macbatch_disk_cache_bytes"] == sum(f.stat().st_size for f in files)
    reply, _, prompt = answers[0]
    assert again == (reply, _cacheable(prompt), prompt)
    assert after[TIER.format("ram")] == _cacheable(prompt)
    assert after[TIER.format("disk")] == from_disk[TIER.format("disk")]


def _stop(process: subprocess.Popen, how: signal.Signals) -> None:
    os.kill(process.pid, how)
    try:
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _wait_for_files(cache: Path, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(_block_files(cache)) < count:
        assert time.monotonic() < deadline, f"{count} block files never appeared in {cache}"
        time.sleep(0.05)


def test_serve_restarts_and_kill_9_keep_the_cache(tiny_model_path: Path, tmp_path: Path):
    """A stopped server's prompt, and a killed one's once its files are on disk, are read back
    from disk by the next ``macbatch serve`` on the cache directory."""
    cache, model = tmp_path / "kv", str(tiny_model_path)
    env = {"MACBATCH_HOME": str(tmp_path / "home")}
    first, second = _text(), _text()
    process, url = start_server(tiny_model_path, "--cache-dir", str(cache), env=env)
    try:
        first_reply, cached, first_prompt = _chat(url, model, first)
        assert cached == 0
    finally:
        _stop(process, signal.SIGTERM)
    assert len(_block_files(cache)) == first_prompt // BLOCK

    process, url = start_server(tiny_model_path, "--cache-dir", str(cache), env=env)
    try:
        assert _chat(url, model, first) == (first_reply, _cacheable(first_prompt), first_prompt)
        second_reply, cached, second_prompt = _chat(url, model, second)
        assert cached == 0
        _wait_for_files(cache, first_prompt // BLOCK + second_prompt // BLOCK)
    finally:
        _stop(process, signal.SIGKILL)

    process, url = start_server(tiny_model_path, "--cache-dir", str(cache), env=env)
    try:
        assert _chat(url, model, second) == (second_reply, _cacheable(second_prompt), second_prompt)
    finally:
        _stop(process, signal.SIGTERM)
