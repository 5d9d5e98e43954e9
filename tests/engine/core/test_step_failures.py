"""A step that raises fails the request behind it, not the engine (issue 46): the others' replies
are mlx-lm's, the engine serves new requests after, and a truly broken engine still raises.

The failure is injected into the sampler for one request's parameters, as `top_k: 2**64` once
failed there (`mx.array(top_k)` raised `std::bad_cast` while building the step's graph)."""

from __future__ import annotations

import pytest

import macbatch.engine.worker.model_runner as model_runner
from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams
from macbatch.engine.engine import MAX_FAILED_STEPS
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import build_model

BAD_SEED = 666  # the parameters the injected failure is tied to
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [18, 19], [20, 21, 22, 23]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


def _engine(model, tokenizer, pipelined: bool = True) -> Engine:
    config = EngineConfig(num_blocks=64, block_size=8, pipelined=pipelined)
    return Engine(model, tokenizer, config)


def _greedy(seed: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, seed=seed)


def _fail_sampling_when(monkeypatch, broken) -> None:
    """The sampler raises for a step whose rows satisfy ``broken(rows)``."""
    sample = model_runner.sample

    def failing(logits, rows):
        if broken(rows):
            raise RuntimeError("std::bad_cast")
        return sample(logits, rows)

    monkeypatch.setattr(model_runner, "sample", failing)


def _bad_after(tokens: int):
    """A step fails once the bad request has sampled ``tokens`` tokens."""
    return lambda rows: any(r.params.seed == BAD_SEED and r.num_generated >= tokens for r in rows)


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("after", [0, 3])  # at its first token, or mid-reply with steps in flight
def test_one_failing_request_fails_alone(model, tiny_tokenizer, monkeypatch, pipelined, after):
    engine = _engine(model, tiny_tokenizer, pipelined)
    _fail_sampling_when(monkeypatch, _bad_after(after))
    params = [_greedy(), _greedy(BAD_SEED), _greedy(), _greedy()]
    outs = engine.generate(PROMPTS, params)

    bad = outs[1]
    assert bad.finish_reason is FinishReason.ERROR and bad.step_failed
    assert "std::bad_cast" in bad.error
    assert bad.token_ids == mlx_lm_greedy(model, PROMPTS[1], after)  # what it had, kept
    for prompt, out in zip(PROMPTS[:1] + PROMPTS[2:], outs[:1] + outs[2:]):
        assert out.finish_reason is FinishReason.LENGTH and not out.step_failed
        assert out.token_ids == mlx_lm_greedy(model, prompt, MAX_TOKENS)
    assert_pool_idle(engine)
    [again] = engine.generate([PROMPTS[0]], _greedy())
    assert again.token_ids == mlx_lm_greedy(model, PROMPTS[0], MAX_TOKENS)


def test_streamed_tokens_are_not_lost(model, tiny_tokenizer, monkeypatch):
    """Each innocent request's outputs add up to its reply: no delta is dropped or repeated
    when the steps in flight are discarded and recomputed."""
    engine = _engine(model, tiny_tokenizer)
    _fail_sampling_when(monkeypatch, _bad_after(3))
    ids = [engine.add_request(p, _greedy(BAD_SEED if i == 1 else 0)) for i, p in enumerate(PROMPTS)]
    streamed: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request_id] += out.new_token_ids
    for i, rid in enumerate(ids):
        expected = mlx_lm_greedy(model, PROMPTS[i], 3 if i == 1 else MAX_TOKENS)
        assert streamed[rid] == expected


def test_a_broken_engine_still_raises(model, tiny_tokenizer, monkeypatch):
    """Every step fails (a one-token request too): the step raises, as before, and the engine
    thread's crash handling (tests/engine/test_runtime.py) fails everything."""
    engine = _engine(model, tiny_tokenizer)
    _fail_sampling_when(monkeypatch, lambda rows: True)
    for prompt in PROMPTS:
        engine.add_request(prompt, _greedy())
    with pytest.raises(RuntimeError, match="std::bad_cast"):
        while engine.has_unfinished():
            engine.step()


def test_a_retry_that_never_finds_the_culprit_ends(model, tiny_tokenizer, monkeypatch):
    """A failure no request reproduces alone (here: any step sampling two rows) cannot loop:
    after MAX_FAILED_STEPS such steps its requests fail, with the tokens they had kept, and a
    request alone still runs."""
    engine = _engine(model, tiny_tokenizer)
    _fail_sampling_when(monkeypatch, lambda rows: len(rows) > 1)
    outs = engine.generate(PROMPTS, _greedy())
    for prompt, out in zip(PROMPTS, outs):
        assert out.finish_reason is FinishReason.ERROR and out.step_failed
        assert 0 < len(out.token_ids) <= MAX_FAILED_STEPS
        assert out.token_ids == mlx_lm_greedy(model, prompt, len(out.token_ids))
    assert_pool_idle(engine)
    [alone] = engine.generate([PROMPTS[2]], _greedy())
    assert alone.token_ids == mlx_lm_greedy(model, PROMPTS[2], MAX_TOKENS)
