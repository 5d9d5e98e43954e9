"""Speculation under structured outputs: every verified row is masked by the grammar as it
stands after the drafts before it, and the request's own matcher sees only accepted tokens.
Oracles: `jsonschema` on the replies, and the same requests without speculation."""

from __future__ import annotations

import json

import jsonschema
import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams, StructuredOutput
from tests.support.oracle import assert_pool_idle
from tests.support.structured import QWEN3_VOCAB, real_tokenizer, schema_family
from tests.support.tiny import build_model

pytestmark = pytest.mark.usefixtures("eager_speculation")


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3", vocab_size=QWEN3_VOCAB)


def _run(model, speculative: str, draft, prompts, params):
    config = EngineConfig(num_blocks=64, block_size=8, max_num_seqs=8, speculative=speculative)
    engine = Engine(model, real_tokenizer("qwen3"), config, draft_model=draft)
    outs = engine.generate(prompts, params)
    assert_pool_idle(engine)
    return outs, engine.stats()


@pytest.mark.parametrize("drafter", ["ngram", "draft-same", "draft-other"])
def test_constrained_replies_are_valid_and_the_same_as_without_speculation(model, drafter):
    schemas = schema_family(6)
    # the schema's own text in the prompt: prompt lookup drafts its keys
    prompts = [[9906, 11] + real_tokenizer("qwen3").encode(json.dumps(s))[:40] for s in schemas]
    params = [
        SamplingParams(
            max_tokens=96,
            temperature=0 if i % 2 else 0.8,
            seed=i,
            structured=StructuredOutput(json_schema=schema),
        )
        for i, schema in enumerate(schemas)
    ]
    params.append(SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))  # unconstrained
    prompts.append([600, 601, 602, 600, 601])
    draft = {
        "draft-same": model,
        "draft-other": build_model("qwen3", seed=3, vocab_size=QWEN3_VOCAB),
    }.get(drafter)
    mode = "draft" if draft is not None else "ngram"
    off, _ = _run(model, "off", None, prompts, params)
    on, stats = _run(model, mode, draft, prompts, params)
    for a, b, schema in zip(off, on, schemas):
        assert b.token_ids == a.token_ids
        assert b.finish_reason is FinishReason.STOP, b.text
        jsonschema.validate(json.loads(b.text), schema)
    assert on[-1].token_ids == off[-1].token_ids
    assert stats.speculation.verifications > 0
    accepted = sum(o.metrics.speculation.accepted for o in on[:-1])
    rejected = sum(o.metrics.speculation.drafted for o in on[:-1]) - accepted
    assert (rejected if drafter == "draft-other" else accepted) > 0
