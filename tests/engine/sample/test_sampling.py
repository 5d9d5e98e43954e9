"""The batched sampler: seeds independent of the batch, filters and penalties against numpy."""

from __future__ import annotations

from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.sample.sampler import SampleRow, sample
from tests.support.tiny import build_model


@dataclass
class _Row:
    """A sampled row as the sampler reads it (``SampleRow``), without a request around it."""

    params: SamplingParams
    seed: int
    num_generated: int
    all_token_ids: list[int]
    output_token_ids: list[int]
    forced: int | None = None

    def forced_token(self) -> int | None:
        return self.forced


def _row(params, seed=0, generated=(), seen=(), forced=None) -> SampleRow:
    return _Row(params, seed, len(generated), list(seen), list(generated), forced)


def test_seeded_request_is_independent_of_its_batch(tiny_tokenizer):
    model = build_model("qwen3")
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64)).generate(
        [[5, 6, 7]], params
    )[0]
    crowd = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64)).generate(
        [[9] * 20, [5, 6, 7], [3, 4]],
        [SamplingParams(max_tokens=12, temperature=0.8), params, SamplingParams(max_tokens=5)],
    )[1]
    assert alone.token_ids == crowd.token_ids
    other_seed = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64)).generate(
        [[5, 6, 7]],
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=99, ignore_eos=True),
    )[0]
    assert other_seed.token_ids != alone.token_ids


def test_an_unfiltered_row_samples_the_same_beside_a_filtered_one():
    """Each token keeps its own noise whether or not another row of the batch has top-k or
    top-p (the filtered path once permuted every row's noise by rank)."""
    rng = np.random.default_rng(1)
    logits = mx.array(rng.normal(0, 2, size=(2, 50)).astype(np.float32))
    plain = SamplingParams(temperature=1.0)
    for seed in range(20):
        alone = sample(logits[:1], [_row(plain, seed)]).tokens.tolist()
        beside = sample(logits, [_row(plain, seed), _row(replace(plain, top_k=3), seed + 1)])
        assert beside.tokens.tolist()[0] == alone[0]


def test_top_k_and_top_p_only_pick_allowed_tokens():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2, dtype=np.float32))
    rows_k = [_row(SamplingParams(temperature=1.0, top_k=2), seed=s) for s in range(2)]
    rows_p = [_row(SamplingParams(temperature=1.0, top_p=0.7), seed=s) for s in range(2)]
    seen_k, seen_p = set(), set()
    for trial in range(200):
        for r in rows_k + rows_p:
            r.num_generated = trial
        seen_k |= set(np.array(sample(mx.array(logits), rows_k).tokens).tolist())
        seen_p |= set(np.array(sample(mx.array(logits), rows_p).tokens).tolist())
    assert seen_k == {0, 1}
    assert seen_p == {0, 1}  # 0.5 alone < 0.7, 0.5 + 0.3 reaches it


def test_a_top_k_past_the_vocabulary_keeps_every_token():
    """The sampler clamps top_k to the vocabulary, so whatever integer a row carries fits the
    int32 array MLX gets (a top_k of 2**64 once raised std::bad_cast inside the engine's step).
    SamplingParams refuses such a value; the row here is forced past it, as a second line."""
    logits = mx.array(np.log(np.array([[0.4, 0.3, 0.2, 0.1]] * 2, dtype=np.float32)))
    params = SamplingParams(temperature=1.0, top_k=4)
    huge = replace(params)
    object.__setattr__(huge, "top_k", 2**64)
    seen = set()
    for trial in range(200):
        before = [0] * trial
        rows = [_row(params, seed=7, generated=before), _row(huge, seed=7, generated=before)]
        same, far = sample(logits, rows).tokens.tolist()
        assert far == same  # past the vocabulary is the same as all of it
        seen.add(far)
    assert seen == {0, 1, 2, 3}


def test_min_p_and_temperature_distribution():
    logits = np.log(np.array([[0.6, 0.3, 0.1]], dtype=np.float32))
    row = _row(SamplingParams(temperature=1.0, min_p=0.2))
    counts = np.zeros(3)
    for trial in range(600):
        row.num_generated = trial
        counts[int(np.array(sample(mx.array(logits), [row]).tokens)[0])] += 1
    assert counts[2] == 0  # 0.1 < 0.2 * 0.6
    assert abs(counts[0] / counts.sum() - 2 / 3) < 0.07  # renormalised 0.6 / 0.9


def test_penalties_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 12)).astype(np.float32)
    params = SamplingParams(
        temperature=0,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logprobs=0,
    )
    rows = [
        _row(params, generated=[3, 3, 5], seen=[1, 3, 3, 5]),
        _row(SamplingParams(temperature=0, logprobs=0)),
    ]
    got = sample(mx.array(logits), rows)
    want = logits.copy()
    for t in (1, 3, 5):
        want[0, t] = want[0, t] / 1.3 if want[0, t] > 0 else want[0, t] * 1.3
    want[0, 3] -= 0.5 + 0.25 * 2
    want[0, 5] -= 0.5 + 0.25 * 1
    assert np.array(got.tokens).tolist() == want.argmax(-1).tolist()
    log_probs = want - np.log(np.exp(want).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.array(got.logprobs), log_probs.max(-1), rtol=1e-5)


def test_a_forced_row_takes_its_token_in_every_sampling_mode():
    """A row's forced token (a thinking budget's end marker) is the only one it can sample,
    with logprob 0, whatever its sampling; the other rows sample as they would alone."""
    rng = np.random.default_rng(2)
    logits = mx.array(rng.normal(0, 2, size=(2, 20)).astype(np.float32))
    unlikely = int(np.argmin(np.array(logits[0])))
    modes = [
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(temperature=1.0, top_k=3, top_p=0.8, logprobs=0),
        SamplingParams(temperature=0.7, min_p=0.3, repetition_penalty=1.5, logprobs=0),
    ]
    for seed, params in enumerate(modes):
        other = _row(replace(params, logprobs=None), seed + 10)
        both = sample(logits, [_row(params, seed, seen=[unlikely], forced=unlikely), other])
        assert both.tokens.tolist()[0] == unlikely
        assert both.logprobs is not None and both.logprobs.tolist()[0] == 0.0
        alone = sample(logits[1:], [other])
        assert both.tokens.tolist()[1] == alone.tokens.tolist()[0]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_same_seed_same_output(tiny_tokenizer, temperature):
    model = build_model("llama")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64))
    params = SamplingParams(max_tokens=10, temperature=temperature, seed=7, ignore_eos=True)
    a, b = engine.generate([[4, 5, 6], [4, 5, 6]], params)
    assert a.token_ids == b.token_ids
