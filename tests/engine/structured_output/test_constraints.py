"""Structured output in the engine: constrained requests of every kind share packed steps with
unconstrained ones; the `jsonschema` library and `re` are the oracles for the constrained replies,
mlx-lm's own generation for the unconstrained ones."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams, StructuredOutput
from macbatch.engine.structured_output.constraints import apply_bitmask
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.structured import QWEN3_VOCAB, real_tokenizer, schema_family
from tests.support.tiny import build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3", vocab_size=QWEN3_VOCAB)


@pytest.fixture(scope="module")
def engine(model):
    """One engine for the module: llguidance's tokenizer index is built once."""
    return Engine(model, real_tokenizer("qwen3"), EngineConfig(num_blocks=256, block_size=8))


def _json(schema) -> SamplingParams:
    return SamplingParams(max_tokens=96, temperature=0, structured=StructuredOutput(schema))


def test_32_schemas_in_one_batch_with_preemption_and_prefix_cache(model):
    engine = Engine(
        model,
        real_tokenizer("qwen3"),
        EngineConfig(num_blocks=40, block_size=8, max_num_seqs=48, enable_prefix_caching=True),
    )
    shared = [9906, 11, 1246, 525, 498, 30, 358, 1079, 7199, 13]  # two full blocks, reused
    schemas = schema_family(32)
    prompts, params, kinds = [], [], []
    for i, schema in enumerate(schemas):
        prompts.append(shared + [400 + i, 77, 500 + i])
        params.append(
            SamplingParams(
                max_tokens=96,
                temperature=0 if i % 2 else 0.8,
                seed=i,
                structured=StructuredOutput(json_schema=schema),
            )
        )
        kinds.append(schema)
        if i % 4 == 0:  # an unconstrained request between every four constrained ones
            prompts.append([600 + i, 601, 602 + i])
            params.append(SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
            kinds.append(None)
    outs = engine.generate(prompts, params)
    for out, prompt, schema in zip(outs, prompts, kinds):
        if schema is None:
            assert out.token_ids == mlx_lm_greedy(model, prompt, 12)
        else:
            assert out.finish_reason is FinishReason.STOP, out.text
            jsonschema.validate(json.loads(out.text), schema)
    assert engine.stats().preemptions > 0
    assert sum(o.metrics.cached_tokens for o in outs) > 0
    assert_pool_idle(engine)


def test_every_kind_of_constraint_together(engine):
    grammar = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    specs = [
        StructuredOutput(regex=r"[a-z]{3}-[0-9]{2}"),
        StructuredOutput(choice=["positive", "negative", "neutral"]),
        StructuredOutput(grammar=grammar),
        StructuredOutput(json_object=True),
    ]
    params = [SamplingParams(max_tokens=40, temperature=0.9, seed=3, structured=s) for s in specs]
    outs = engine.generate([[11, 12, 13 + i] for i in range(4)], params)
    assert all(o.finish_reason is FinishReason.STOP for o in outs[:3]), [o.text for o in outs]
    assert re.fullmatch(r"[a-z]{3}-[0-9]{2}", outs[0].text)
    assert outs[1].text in ("positive", "negative", "neutral")
    assert re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})*\)", outs[2].text)
    if outs[3].finish_reason is FinishReason.STOP:
        assert isinstance(json.loads(outs[3].text), dict)
    else:  # length: the text as is, a prefix of a JSON object
        assert outs[3].text.startswith("{")
    # A seeded constrained request gives the same reply alone as in a batch.
    alone = engine.generate([[11, 12, 14]], params[1])[0]
    assert alone.token_ids == outs[1].token_ids
    # A stop string cuts a constrained reply like any other.
    cut = engine.generate([[11, 12, 13]], replace(params[0], stop=("-",)))[0]
    assert (cut.text, cut.finish_reason) == (outs[0].text.split("-")[0], FinishReason.STOP)


def test_logprobs_are_of_the_constrained_distribution(engine):
    params = SamplingParams(
        max_tokens=4,
        temperature=0,
        logprobs=5,
        structured=StructuredOutput(choice=["yes", "no"]),
    )
    out = engine.generate([[5, 6, 7]], params)[0]
    first = out.top_logprobs[0]
    allowed = {t for t in first if first[t] > -math.inf}
    words = {engine.tokenizer.decode([t]) for t in allowed}
    assert words <= {"yes", "no", "y", "n", "ye"}  # only tokens that start a choice
    assert math.isclose(sum(math.exp(v) for v in first.values() if v > -math.inf), 1, rel_tol=1e-4)


def test_length_before_the_grammar_completes(engine):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    params = SamplingParams(max_tokens=3, temperature=0, structured=StructuredOutput(schema))
    out = engine.generate([[1, 2, 3]], params)[0]
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.token_ids) == 3 and out.text.startswith('{"a":')


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dict(json_schema={"type": "objekt"}), "invalid json schema"),
        (dict(regex="a(b"), "unclosed group"),
        (dict(grammar="start: missing_rule"), "unknown name"),
        (dict(choice=[]), "at least one"),
        (dict(regex="a", choice=["a"]), "exactly one"),
        (dict(json_schema="{not json"), "not valid JSON"),
    ],
)
def test_invalid_constraint_is_refused_at_submission(engine, spec, message):
    with pytest.raises(ValueError, match=message):
        params = SamplingParams(max_tokens=4, structured=StructuredOutput(**spec))
        engine.add_request([1, 2, 3], params)
    assert not engine.has_unfinished()
    assert engine.generate([[1, 2]], SamplingParams(max_tokens=2))[0].finish_reason


def test_constraint_waits_for_the_reasoning_block_to_end(engine):
    """A thinking chat turn: `<think>` may open, no mask inside, the grammar after `</think>`."""
    from macbatch.engine.parsers.reasoning import Phase, ReasoningTracker
    from macbatch.engine.structured_output.constraints import ConstraintState

    tokenizer = engine.tokenizer
    fmt = engine.info.model.reasoning_format
    messages = [{"role": "user", "content": "hi"}]
    thinking = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    plain = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=False
    )
    assert fmt.initial_phase(thinking) is Phase.MAYBE
    assert fmt.initial_phase(plain) is Phase.ANSWER
    assert fmt.initial_phase(thinking + list(fmt.start_ids)) is Phase.REASONING

    tracker = ReasoningTracker(fmt, Phase.MAYBE)
    spec = StructuredOutput(choice=["yes", "no"])
    state = ConstraintState(engine.constraints.compile(spec), tracker)
    # The mask starts right after `</think>`: a thinking model answers "yes", not "\n\nyes".
    reply = tokenizer.encode("<think>\nanything at all {\n</think>yes", add_special_tokens=False)
    generated = []
    for token in reply:
        before = tracker.phase
        generated.append(token)
        tracker.advance(generated)
        assert state.accept(token, before, len(generated) - 1) is None, tokenizer.decode(generated)
    assert state.matcher.is_accepting()
    text = tokenizer.decode(reply)
    assert tracker.split(text) == ("anything at all {\n", "yes")
    bad = ConstraintState(engine.constraints.compile(spec), None)
    assert bad.accept(tokenizer.encode("maybe", add_special_tokens=False)[0], Phase.ANSWER, 0)


def test_reasoning_is_split_from_the_answer_and_never_masked(model):
    """A DeepSeek-R1-style template opens <think> itself: everything generated is reasoning,
    streamed as such, and a constraint waits (the tokens equal the unconstrained run's)."""
    tokenizer = real_tokenizer("qwen3")
    qwen3_template = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    try:
        engine = Engine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))
        chat = [{"role": "user", "content": "Is 7 prime?"}]
        plain = SamplingParams(max_tokens=10, temperature=0)
        constrained = SamplingParams(
            max_tokens=10, temperature=0, structured=StructuredOutput(choice=["yes", "no"])
        )
        rid = engine.add_request(chat, constrained)
        streamed = []
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == rid:
                    streamed.append(out.new_reasoning)
                    final = out
        [reference] = engine.generate([chat], plain)
    finally:
        tokenizer.chat_template = qwen3_template  # the tokenizer is shared by the other tests
    assert final.token_ids == reference.token_ids  # no mask inside the reasoning block
    decoded = tokenizer.decode(reference.token_ids)
    assert final.reasoning == decoded.lstrip("\n") == "".join(streamed)
    assert final.text == "" and final.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("vocab", [100, 151936])
def test_bitmask_apply_matches_a_numpy_oracle(vocab):
    """Bit j of word w allows token 32*w + j (llguidance's layout); a vocabulary that is not a
    multiple of 32 ignores the padding bits; an all-ones row passes through unchanged."""
    rng = np.random.default_rng(vocab)
    words = rng.integers(0, 2**32, size=(3, (vocab + 31) // 32), dtype=np.uint64)
    words = words.astype(np.uint32).view(np.int32)
    words[1] = -1
    logits = rng.normal(size=(3, vocab)).astype(np.float32)
    tokens = np.arange(vocab)
    bits = (words.view(np.uint32)[:, tokens // 32] >> (tokens % 32).astype(np.uint32)) & 1
    want = np.where(bits == 1, logits, -np.inf)
    got = np.array(apply_bitmask(mx.array(logits), words))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[1], logits[1])
