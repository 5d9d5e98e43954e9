"""The Batch API with the official openai client against a real server (tiny model): a batch's
output equals the engine's own greedy generation, each custom_id once; cancel keeps what is
done; /metrics shows progress; bad input on every endpoint is a 4xx in OpenAI's error shape and
the server keeps serving. (kill -9 and resume: test_batch_restart.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from macbatch.engine import EngineThread, SamplingParams
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import CHAT, DONE, batch_lines, jsonl, output_lines, wait_for
from tests.support.live_server import Served, engine_generate, serving
from tests.support.metrics_scrape import scrape

LIMIT = 1024 * 1024
IN_FLIGHT = 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def server(engine_thread: EngineThread, data_dir: Path) -> Iterator:
    options = ServerOptions(data_dir=data_dir, max_file_bytes=LIMIT, batch_max_in_flight=IN_FLIGHT)
    with serving(engine_thread, options) as served:
        yield served
        stop_batches(served.app)


@pytest.fixture
def client(server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def _upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("input.jsonl", data), purpose="batch").id


def _run(client: openai.OpenAI, data: bytes, endpoint: str = CHAT):
    batch = client.batches.create(
        input_file_id=_upload(client, data), endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h", metadata={"run": "test"},
    )  # fmt: skip
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "test"}
    return wait_for(client, batch.id, lambda b: b.status in DONE)


@pytest.mark.parametrize("endpoint", [CHAT, "/v1/completions"])
def test_output_equals_the_engine(client: openai.OpenAI, server: Served, endpoint: str) -> None:
    rows = batch_lines(12, max_tokens=6, url=endpoint)
    batch = _run(client, jsonl(rows), endpoint)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    assert batch.error_file_id is None and batch.completed_at is not None
    lines = output_lines(client, batch.output_file_id)
    assert Counter(line["custom_id"] for line in lines) == {row["custom_id"]: 1 for row in rows}
    prompts = [row["body"].get("messages", row["body"].get("prompt")) for row in rows]
    expected = engine_generate(server.thread, prompts, SamplingParams(max_tokens=6, temperature=0))
    by_id = {line["custom_id"]: line for line in lines}
    for row, want in zip(rows, expected):
        line = by_id[row["custom_id"]]
        assert line["error"] is None and line["response"]["status_code"] == 200
        choice = line["response"]["body"]["choices"][0]
        text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
        assert text == want.text
        assert line["response"]["body"]["usage"]["prompt_tokens"] == want.metrics.prompt_tokens
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.bytes == len(
        client.files.content(batch.output_file_id).content
    )
    assert batch.id in [b.id for b in client.batches.list()]


def test_a_row_with_n_is_one_line_with_its_choices(client: openai.OpenAI, server: Served) -> None:
    """One output line per custom_id, holding the body's n choices (seed + i each), as the
    official client parses it and as serve answers the same body; it was n lines of one."""
    rows = batch_lines(2, max_tokens=5)
    for row in rows:
        row["body"].update(n=3, seed=11, temperature=1.0)
    batch = _run(client, jsonl(rows))
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 2, "completed": 2, "failed": 0}
    lines = output_lines(client, batch.output_file_id)
    assert Counter(line["custom_id"] for line in lines) == {"r0": 1, "r1": 1}
    for row in rows:
        [line] = [x for x in lines if x["custom_id"] == row["custom_id"]]
        reply = ChatCompletion.model_validate(line["response"]["body"])
        assert [c.index for c in reply.choices] == [0, 1, 2]
        prompt = row["body"]["messages"]
        params = [SamplingParams(max_tokens=5, seed=s, temperature=1.0) for s in (11, 12, 13)]
        expected = [engine_generate(server.thread, [prompt], p)[0] for p in params]
        assert [c.message.content for c in reply.choices] == [e.text for e in expected]


def test_bad_rows_go_to_the_error_file(client: openai.OpenAI) -> None:
    rows = batch_lines(3, max_tokens=2)
    rows[1]["body"]["temperature"] = "hot"
    batch = _run(client, jsonl(rows))
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    [error] = output_lines(client, batch.error_file_id)
    assert error["custom_id"] == "r1" and "temperature" in error["error"]["message"]
    assert {x["custom_id"] for x in output_lines(client, batch.output_file_id)} == {"r0", "r2"}


def test_cancel_keeps_what_is_done(client: openai.OpenAI, server: Served) -> None:
    """A slow batch (long replies, IN_FLIGHT at a time) is cancelled after a few rows: it ends
    cancelled, its output holds the rows done, once each; /metrics showed its progress and the
    engine never held more than IN_FLIGHT of its requests; a live request was served."""
    rows = batch_lines(300, max_tokens=64)
    batch = client.batches.create(
        input_file_id=_upload(client, jsonl(rows)), endpoint=CHAT, completion_window="24h"
    )
    wait_for(client, batch.id, lambda b: b.request_counts.completed >= 3)
    metrics = scrape(server)
    done = metrics[f'macbatch_batch_requests{{batch="{batch.id}",state="completed"}}']
    assert metrics[f'macbatch_batch_requests{{batch="{batch.id}",state="total"}}'] == 300
    assert 3 <= done < 300 and metrics["macbatch_requests_running"] <= IN_FLIGHT
    hello = [{"role": "user", "content": "hi"}]
    model = server.thread.info.model_name
    live = client.chat.completions.create(model=model, messages=hello, max_tokens=3)
    assert live.choices[0].finish_reason in ("length", "stop")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    ended = wait_for(client, batch.id, lambda b: b.status in DONE)
    assert ended.status == "cancelled" and ended.cancelled_at is not None
    lines = output_lines(client, ended.output_file_id)
    ids = Counter(line["custom_id"] for line in lines)
    assert set(ids.values()) == {1} and 3 <= len(ids) < 300
    assert ended.request_counts.completed == len(ids)
    with pytest.raises(openai.ConflictError) as conflict:
        client.batches.cancel(batch.id)
    assert conflict.value.response.json()["error"]["type"] == "invalid_request_error"
    assert scrape(server)['macbatch_batches{status="cancelled"}'] >= 1


def test_files(client: openai.OpenAI) -> None:
    data = jsonl(batch_lines(2, max_tokens=1))
    file_id = _upload(client, data)
    meta = client.files.retrieve(file_id)
    assert (meta.bytes, meta.purpose, meta.filename) == (len(data), "batch", "input.jsonl")
    assert client.files.content(file_id).content == data
    assert file_id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(file_id)


def _refused(response: httpx.Response, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param, error


def _create(http: httpx.Client, **body: object) -> httpx.Response:
    return http.post("/batches", json=body)


def test_bad_input_is_a_4xx(server: Served, client: openai.OpenAI) -> None:
    http = httpx.Client(base_url=server.api, timeout=60)
    good = _upload(client, jsonl(batch_lines(2, max_tokens=1)))
    files = {"file": ("x.jsonl", b"{}\n")}
    _refused(http.post("/files", data={"purpose": "fine-tune"}, files=files), 400, "purpose")
    _refused(http.post("/files", data={"purpose": "batch"}), 400, "file")
    _refused(http.post("/files", content=b"not a form"), 400)
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(file=("big.jsonl", b"x" * (20 * 1024 * 1024)), purpose="batch")
    _refused(big.value.response, 413, "file")
    for path in ("/files/file-nope", "/files/file-nope/content", "/batches/batch_nope"):
        _refused(http.get(path), 404)
    _refused(http.delete("/files/file-nope"), 404)
    _refused(http.post("/batches/batch_nope/cancel"), 404)
    window = {"completion_window": "24h"}
    _refused(_create(http, endpoint=CHAT, **window), 400, "input_file_id")
    _refused(_create(http, input_file_id=5, endpoint=CHAT, **window), 400, "input_file_id")
    _refused(_create(http, input_file_id=good, endpoint=5, **window), 400, "endpoint")
    _refused(_create(http, input_file_id=good, endpoint="/v1/score", **window), 400, "endpoint")
    _refused(_create(http, input_file_id=good, endpoint=CHAT), 400, "completion_window")
    _refused(_create(http, input_file_id="file-nope", endpoint=CHAT, **window), 404)
    bad_meta = {"metadata": {"a": 1}, **window}
    _refused(_create(http, input_file_id=good, endpoint=CHAT, **bad_meta), 400, "metadata.a")
    _refused(_create(http, input_file_id=good, endpoint=CHAT, model="x", **window), 400, "model")
    _refused(http.post("/batches", content=b"{"), 400)
    for limit in ("0", "²", "9" * 5_000):
        _refused(http.get("/batches", params={"limit": limit}), 400, "limit")
    twice = batch_lines(2, max_tokens=1)
    twice[1]["custom_id"] = "r0"
    other_url = batch_lines(1, max_tokens=1, url="/v1/completions")
    for rows in (twice, other_url, []):
        bad = _upload(client, jsonl(rows) + b"not json\n" * (not rows))
        _refused(_create(http, input_file_id=bad, endpoint=CHAT, **window), 400, "input_file_id")
    assert http.get(server.url + "/health").status_code == 200
    assert _run(client, jsonl(batch_lines(1, max_tokens=1))).status == "completed"


def test_a_stopped_server_resumes_its_batch(engine_thread: EngineThread, tmp_path: Path) -> None:
    """A clean stop mid-batch (serve's shutdown) leaves it in_progress on disk; the next server
    on the same data directory finishes it, each custom_id once."""
    options = ServerOptions(data_dir=tmp_path, batch_max_in_flight=IN_FLIGHT)
    rows = batch_lines(200, max_tokens=16)
    with serving(engine_thread, options) as first:
        client = openai.OpenAI(base_url=first.api, api_key="unused", max_retries=0)
        upload = client.files.create(file=("rows.jsonl", jsonl(rows)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
        )
        wait_for(client, batch.id, lambda b: b.request_counts.completed >= 5)
        stop_batches(first.app)
        stopped = client.batches.retrieve(batch.id)
    assert stopped.status == "in_progress" and stopped.request_counts.completed < 200
    with serving(engine_thread, options) as second:
        client = openai.OpenAI(base_url=second.api, api_key="unused", max_retries=0)
        ended = wait_for(client, batch.id, lambda b: b.status in DONE)
        lines = output_lines(client, ended.output_file_id)
        stop_batches(second.app)
    assert ended.status == "completed" and ended.request_counts.completed == 200
    assert Counter(line["custom_id"] for line in lines) == {row["custom_id"]: 1 for row in rows}


def test_without_a_data_directory_the_batch_api_says_so(served: Served) -> None:
    response = httpx.get(served.api + "/batches")
    _refused(response, 503)
    assert "data directory" in response.json()["error"]["message"]


def test_one_server_runs_batches_per_data_directory(
    engine_thread: EngineThread, data_dir: Path, server: Served
) -> None:
    """Two would run the same rows twice: a second server on the directory answers 503."""
    with serving(engine_thread, ServerOptions(data_dir=data_dir)) as second:
        response = httpx.get(second.api + "/batches")
        stop_batches(second.app)
    _refused(response, 503)
    assert "another macbatch serve" in response.json()["error"]["message"]
    assert httpx.get(server.api + "/batches").status_code == 200
