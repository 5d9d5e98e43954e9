"""Request lifecycle: abort, bad input, stopping, streaming deltas, metrics."""

from __future__ import annotations

import math

import pytest

from macbatch.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    InvalidSamplingParam,
    SamplingParams,
)
from macbatch.engine.sample.params import MAX_INT, SEED_RANGE
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import VOCAB_SIZE, build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


@pytest.fixture
def engine(model, tiny_tokenizer):
    return Engine(
        model, tiny_tokenizer, EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    )


GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _drain(engine):
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


@pytest.mark.parametrize("when", ["waiting", "mid_prefill", "mid_decode"])
def test_abort_frees_blocks_and_others_continue(engine, model, when):
    other = list(range(10, 30))
    victim = engine.add_request(list(range(40, 80)), GREEDY)  # 40 tokens: 3 prefill steps
    keeper = engine.add_request(other, GREEDY)
    steps = {"waiting": 0, "mid_prefill": 1, "mid_decode": 4}[when]
    for _ in range(steps):
        engine.step()
    engine.abort(victim)
    finals = _drain(engine)
    assert finals[victim].finish_reason == FinishReason.ABORT
    assert finals[keeper].token_ids == mlx_lm_greedy(model, other, GREEDY.max_tokens)
    assert_pool_idle(engine)


@pytest.mark.parametrize(
    "prompt,params,message",
    [
        ([], GREEDY, "prompt is empty"),
        ("", GREEDY, "prompt is empty"),
        ([1, VOCAB_SIZE + 5], GREEDY, "outside the vocabulary"),
        ([-1], GREEDY, "outside the vocabulary"),
        ([{"role": "user"}], GREEDY, "'role' and 'content'"),
        (42, GREEDY, "prompt must be"),
    ],
)
def test_bad_prompt_is_rejected_and_engine_keeps_serving(engine, model, prompt, params, message):
    good = engine.add_request([5, 6, 7], GREEDY)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    finals = _drain(engine)
    assert list(finals) == [good]
    assert finals[good].token_ids == mlx_lm_greedy(model, [5, 6, 7], GREEDY.max_tokens)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1e308}, "repetition_penalty"),  # inf in float32
        ({"stop": [""]}, "stop"),
        # integers past what the sampler hands MLX (2**64 once raised inside the step)
        ({"top_k": 2**64}, "top_k"),
        ({"top_k": MAX_INT + 1}, "top_k"),
        ({"max_tokens": MAX_INT + 1}, "max_tokens"),
        ({"seed": SEED_RANGE[1] + 1}, "seed"),
        ({"seed": SEED_RANGE[0] - 1}, "seed"),
        ({"stop_token_ids": [MAX_INT + 1]}, "stop_token_ids"),
        ({"thinking_token_budget": MAX_INT + 1}, "thinking_token_budget"),
        ({"logprobs": 21}, "logprobs"),
        ({"top_k": True}, "top_k"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(InvalidSamplingParam, match=f"invalid sampling parameter {field}=") as err:
        SamplingParams(**kwargs)
    assert err.value.field == field


def test_values_at_every_bound_run(engine):
    """The bounds are what the engine takes: a request at each of them samples and finishes."""
    edges = [
        SamplingParams(max_tokens=MAX_INT, top_k=MAX_INT, seed=SEED_RANGE[1], temperature=1.0),
        SamplingParams(max_tokens=4, top_k=1, seed=SEED_RANGE[0], temperature=1.0, min_p=0.5),
        SamplingParams(max_tokens=4, stop_token_ids=(MAX_INT,), thinking_token_budget=MAX_INT),
        SamplingParams(max_tokens=4, repetition_penalty=0.01, temperature=2.0, logprobs=20),
        SamplingParams(max_tokens=4, repetition_penalty=100.0, top_p=1e-9, temperature=2.0),
    ]
    ids = [engine.add_request([5 + i, 6, 7], params) for i, params in enumerate(edges)]
    finals = _drain(engine)
    assert set(finals) == set(ids)
    assert all(out.finish_reason is not FinishReason.ERROR for out in finals.values())


def test_prompt_that_fills_the_context_is_refused_and_nothing_is_queued(engine):
    with pytest.raises(
        ValueError,
        match=r"prompt \(512 tokens\) leaves no room for a reply in "
        r"the whole KV cache pool \(512 tokens\)",
    ):
        engine.add_request([5] * 512, GREEDY)
    assert not engine.has_unfinished()


def test_max_tokens_is_a_cap_that_shrinks_to_the_room_left(engine, model):
    """One rule for every front end: prompt + max_tokens beyond the context runs with the room
    the prompt leaves, and the output says it was capped; a request that fits is untouched."""
    prompt = [3 + i % 300 for i in range(497)]  # 497 tokens of a 512-token pool: room for 15
    capped = engine.add_request(prompt, SamplingParams(max_tokens=100, ignore_eos=True))
    fits = engine.add_request([9, 9, 9], GREEDY)
    finals = _drain(engine)
    assert finals[capped].capped_max_tokens == 15
    assert finals[capped].finish_reason == FinishReason.LENGTH
    assert len(finals[capped].token_ids) == 15
    assert finals[fits].capped_max_tokens is None
    assert finals[fits].token_ids == mlx_lm_greedy(model, [9, 9, 9], GREEDY.max_tokens)
    assert_pool_idle(engine)


def test_max_tokens_none_takes_all_the_room_without_calling_it_capped(engine):
    rid = engine.add_request([4] * 497, SamplingParams(max_tokens=None, ignore_eos=True))
    final = _drain(engine)[rid]
    assert len(final.token_ids) == 15 and final.capped_max_tokens is None


def test_eos_and_stop_token_ids_end_without_emitting(engine, model):
    prompt = [11, 12, 13]
    reference = mlx_lm_greedy(model, prompt, 8)
    stop_at = reference[3]
    first = reference.index(stop_at)
    out = engine.generate(
        [prompt], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_at])
    )[0]
    assert out.finish_reason == FinishReason.STOP
    assert out.token_ids == reference[:first]


def test_stop_string_across_token_boundaries(engine, model, tiny_tokenizer):
    """A stop string spanning two tokens ends the text before it, and no streamed delta ever
    contained any part of it."""
    prompt = [20, 21, 22]
    reference = mlx_lm_greedy(model, prompt, 12)
    full_text = tiny_tokenizer.decode(reference)
    # Two characters around the boundary between the 3rd and 4th tokens' text.
    cut = len(tiny_tokenizer.decode(reference[:3]))
    stop = full_text[cut - 1 : cut + 1]
    assert len(stop) == 2
    expected = full_text[: full_text.index(stop)]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=12, temperature=0, stop=[stop]))
    deltas, final = [], None
    while final is None:
        for out in engine.step():
            if out.request_id == rid:
                deltas.append(out.new_text)
                final = out if out.finished else None
    assert final.finish_reason == FinishReason.STOP
    assert final.text == expected
    assert "".join(deltas) == expected


def test_streamed_deltas_add_up_and_metrics(engine, model, tiny_tokenizer):
    rid = engine.add_request([30, 31, 32, 33], GREEDY)
    tokens, text = [], ""
    final = None
    while final is None:
        for out in engine.step():
            tokens += out.new_token_ids
            text += out.new_text
            final = out if out.finished else None
    assert tokens == final.token_ids == mlx_lm_greedy(model, [30, 31, 32, 33], 8)
    assert text == final.text == tiny_tokenizer.decode(tokens)
    m = final.metrics
    assert (m.prompt_tokens, m.generated_tokens) == (4, 8)
    assert 0 <= m.queue_time_s <= m.time_to_first_token_s <= m.total_time_s
    assert m.decode_tokens_per_s > 0
    assert final.request_id == rid


def test_logprobs_are_normalised_and_match_choice(engine):
    out = engine.generate(
        [[7, 8, 9]], SamplingParams(max_tokens=4, temperature=0, logprobs=3, ignore_eos=True)
    )[0]
    assert len(out.logprobs) == len(out.top_logprobs) == 4
    for token, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert max(top, key=top.get) == token  # greedy picks the most likely token
        assert top[token] == pytest.approx(lp)
        assert all(v <= 0 for v in top.values())


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_far_past_the_context_is_refused_before_tokenizing(
    engine, chat, monkeypatch: pytest.MonkeyPatch
):
    """Issue 46: a 10 MB body against a 512-token context took 2.5 GB and seconds to template
    and tokenize before its refusal. Its characters alone prove it cannot fit: refused as a
    too-long prompt with neither templating nor tokenizing."""
    from macbatch.engine import PromptTooLongError
    from macbatch.engine.inputs import chat_template

    def never(*args, **kwargs):
        raise AssertionError("the prompt was templated or tokenized")

    monkeypatch.setattr(chat_template, "encode_text", never)
    monkeypatch.setattr(chat_template, "render_chat", never)
    text = "word " * 2_000_000
    prompt = [{"role": "user", "content": [{"type": "text", "text": text}]}] if chat else text
    with pytest.raises(PromptTooLongError, match=r"leaves no room for a reply in .*512 tokens"):
        engine.add_request(prompt, GREEDY)
    assert not engine.has_unfinished()


@pytest.mark.parametrize("name", ["qwen3", "mistral"])
def test_the_character_bound_holds_on_real_tokenizers(name):
    """No text of n characters is fewer than n / longest_token tokens, even text made of the
    longest tokens: Qwen3 has 128-space tokens (5,000 spaces: 40 tokens), so a fixed bound of
    64 characters per token would refuse prompts that fit; the vocabulary's own bound does not."""
    from macbatch.engine.inputs.processor import longest_token
    from tests.support.real_tokenizers import load_real_tokenizer

    tokenizer = load_real_tokenizer(name)
    longest = longest_token(tokenizer)
    vocab = tokenizer.get_vocab()
    texts = [" " * 40_000, "\n" * 40_000, "=" * 40_000, "word " * 8_000, "長" * 20_000]
    texts += [tokenizer.decode([vocab[max(vocab, key=len)]]) * 200]  # the longest entry, repeated
    for text in texts:
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert tokens * longest >= len(text), (name, text[:10], tokens, longest)
    if name == "qwen3":
        assert len(tokenizer.encode(" " * 40_000, add_special_tokens=False)) * 64 < 40_000
