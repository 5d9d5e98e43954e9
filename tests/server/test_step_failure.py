"""A request the engine's step fails on gets a 500 of its own; a stream in flight beside it
completes with the reply it would have had alone, and the server keeps serving (issue 46: one
`top_k` once took the engine down for everyone, every later request a 503)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

import macbatch.engine.worker.model_runner as model_runner
from macbatch.engine import SamplingParams
from tests.support.live_server import Served, engine_generate

STREAM_SEED, BAD_SEED = 667, 666  # which rows the injected sampler tells apart
PROMPT = "tell me about the sea"


def test_a_failing_request_is_its_own_500(served: Served, monkeypatch) -> None:
    thread = served.thread
    model = thread.info.model_name
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    [alone] = engine_generate(thread, [PROMPT], params)

    bad_submitted = threading.Event()
    enqueue = thread.enqueue

    def noting_enqueue(request, *args, **kwargs):
        request_id = enqueue(request, *args, **kwargs)
        if request.params.seed == BAD_SEED:
            bad_submitted.set()  # queued: the engine adds it between its next steps
        return request_id

    sample = model_runner.sample

    def failing(logits, rows):
        seeds = {r.params.seed for r in rows}
        if BAD_SEED in seeds:
            raise RuntimeError("std::bad_cast")
        if any(r.params.seed == STREAM_SEED and r.num_generated == 5 for r in rows):
            assert bad_submitted.wait(60)  # the bad request joins the stream's steps
        return sample(logits, rows)

    monkeypatch.setattr(thread, "enqueue", noting_enqueue)
    monkeypatch.setattr(model_runner, "sample", failing)
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0)
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=30, temperature=0, seed=STREAM_SEED, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model=model, prompt="hi", max_tokens=4, seed=BAD_SEED)
    error = failed.value.body
    assert error["code"] == "engine_error" and error["type"] == "server_error"
    assert "std::bad_cast" in error["message"]

    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == alone.text
    assert chunks[-1].choices[0].finish_reason == "length"

    assert httpx.get(served.url + "/health").json()["status"] == "ok"
    again = client.completions.create(model=model, prompt=PROMPT, max_tokens=30, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    assert again.choices[0].text == alone.text
