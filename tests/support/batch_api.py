"""Batch API test helpers: OpenAI batch input files, and waiting on a batch with the official
client."""

from __future__ import annotations

import json
import time
from typing import Any

import openai

CHAT = "/v1/chat/completions"
DONE = ("completed", "cancelled", "failed", "expired")


def chat_body(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "any",
        "messages": [{"role": "user", "content": f"row {i}: the quick brown fox"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def batch_lines(count: int, max_tokens: int, url: str = CHAT) -> list[dict[str, Any]]:
    """``count`` requests, custom ids r0, r1, ...; chat rows, or raw prompts for completions."""
    rows = []
    for i in range(count):
        body = chat_body(i, max_tokens)
        if url != CHAT:
            body = {"prompt": f"row {i}: the quick brown fox", **body}
            del body["messages"]
        rows.append({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})
    return rows


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def wait_for(client: openai.OpenAI, batch_id: str, check: Any, timeout: float = 300) -> Any:
    """Poll the batch until ``check(batch)``; returns that batch."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if check(batch):
            return batch
        assert time.monotonic() < deadline, f"batch never got there: {batch}"
        time.sleep(0.1)


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    data = client.files.content(file_id).content
    assert not data or data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def run_batch(client: openai.OpenAI, url: str, bodies: dict[str, dict[str, Any]]) -> Any:
    """Upload one row per ``bodies`` entry (its key the custom id), create a batch on ``url``,
    and return it once it has ended."""
    rows = [
        {"custom_id": name, "method": "POST", "url": url, "body": body}
        for name, body in bodies.items()
    ]
    upload = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")
    return wait_for(client, batch.id, lambda b: b.status in DONE)
