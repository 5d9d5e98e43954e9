"""A server whose engine speculates: OpenAI's own client gets the same replies with and without
speculation (and with the per-request opt-out), and /metrics reports the acceptance."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from macbatch.engine import Engine, EngineThread, SamplingParams
from tests.support.live_server import ENGINE_CONFIG, serving
from tests.support.metrics_scrape import scrape

PROMPT = "hello world hello world hello world hello world hello"


@pytest.fixture(scope="module")
def speculating(tiny_model_path):
    config = dataclasses.replace(ENGINE_CONFIG, speculative="ngram", max_num_seqs=8)
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), config)).start()
    thread.wait_ready(timeout=120)
    with serving(thread) as server:
        yield server
    thread.shutdown()


def _complete(server, **extra) -> str:
    client = openai.OpenAI(base_url=server.api, api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=extra
    )
    return reply.choices[0].text


def test_replies_match_the_engine_without_speculation_and_metrics_count(
    speculating, tiny_model_path
):
    plain = Engine.load(str(tiny_model_path), ENGINE_CONFIG)
    ids = plain.encode_prompt(PROMPT)
    expected = plain.generate([ids], SamplingParams(max_tokens=24, temperature=0))[0].text
    assert _complete(speculating) == expected
    metrics = scrape(speculating)
    drafted = metrics["macbatch_spec_drafted_tokens_total"]
    assert drafted > 0
    assert 0 < metrics["macbatch_spec_acceptance_rate"] <= 1
    assert metrics["macbatch_spec_mean_accepted_length"] >= 1
    assert metrics['macbatch_spec_drafter{method="ngram"}'] == 1  # what drafts
    # one finished request that verified drafts: the per-request histograms hold its numbers,
    # which for a lone request are the engine's totals
    rate, length = "macbatch_spec_request_acceptance_rate", "macbatch_spec_request_accepted_length"
    assert metrics[f"{rate}_count"] == metrics[f"{length}_count"] == 1
    assert metrics[f"{rate}_sum"] == pytest.approx(metrics["macbatch_spec_acceptance_rate"])
    assert metrics[f"{length}_sum"] == pytest.approx(metrics["macbatch_spec_mean_accepted_length"])
    assert metrics[f'{rate}_bucket{{le="1.0"}}'] == 1
    assert _complete(speculating, speculative=False) == expected  # opted out: nothing drafted
    after = scrape(speculating)
    assert after["macbatch_spec_drafted_tokens_total"] == drafted
    assert after[f"{rate}_count"] == 1  # a request that drafted nothing is not one of them
