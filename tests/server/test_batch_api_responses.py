"""/v1/responses batches through the Batch API with the official openai client (tiny model):
each output line's body is the response ``POST /v1/responses`` gives for the same body (greedy;
ids and times aside); rows that cannot run are lines of the error file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import output_lines, run_batch
from tests.support.live_server import Served, serving

URL = "/v1/responses"
GOOD: dict[str, dict[str, Any]] = {
    "text": {"input": "the quick brown fox", "max_output_tokens": 6, "temperature": 0},
    "items": {
        "instructions": "Answer briefly.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "and again"},
        ],
        "max_output_tokens": 5,
        "temperature": 0,
        "metadata": {"tag": "x"},
    },
    "long": {"input": "count", "max_output_tokens": 1, "temperature": 0},  # incomplete
}
BAD = {
    "continues": {"input": "x", "previous_response_id": "resp_abc"},
    "background": {"input": "x", "background": True},
    "no_input": {"input": 5},
}
# random or timed per response, or how much of the prompt the prefix cache held
VOLATILE = ("id", "created_at", "completed_at", "cached_tokens")


@pytest.fixture(scope="module")
def server(engine_thread: EngineThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    options = ServerOptions(data_dir=tmp_path_factory.mktemp("data"))
    with serving(engine_thread, options) as served:
        yield served
        stop_batches(served.app)


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_responses_batch_equals_the_route(server: Served, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    batch = run_batch(client, URL, {**GOOD, **BAD})
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 3, "failed": 3}
    lines = {line["custom_id"]: line for line in output_lines(client, batch.output_file_id)}
    assert sorted(lines) == sorted(GOOD)
    for name, body in GOOD.items():
        got = lines[name]["response"]["body"]
        raw = client.responses.with_raw_response.create(**body, store=False)
        assert raw.parse().output_text is not None  # the client reads it as a response
        live = raw.http_response.json()
        assert got["object"] == "response" and got["output"] and got["store"] is False
        assert _stable(got) == _stable(live)
        assert got["id"] == lines[name]["response"]["request_id"].join(("resp_", ""))
    assert lines["long"]["response"]["body"]["status"] == "incomplete"
    assert lines["long"]["macbatch"]["finish_reason"] == "length"
    errors = {line["custom_id"]: line for line in output_lines(client, batch.error_file_id)}
    assert sorted(errors) == sorted(BAD)
    assert "previous_response_id" in errors["continues"]["error"]["message"]
    assert "background" in errors["background"]["error"]["message"]
