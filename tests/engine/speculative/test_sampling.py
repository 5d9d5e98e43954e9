"""Speculative sampling is exact: the target's distribution at any temperature, top-p, top-k.

Oracles: a float64 numpy softmax with the filters applied (scipy's chi-square test, at
significance 0.001, over thousands of draws) for the verification rule on its own and for the
engine's emitted tokens; and the engine without speculation, whose seeded samples a speculating
engine must reproduce token for token (penalties, logprobs, several samples of one prompt)."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.sample.sampler import sample
from macbatch.engine.speculative.verify import DraftRow, emitted_rows
from tests.support.fake_requests import make_request
from tests.support.tiny import build_model

SIGNIFICANCE = 1e-3
FILTERS = {
    "temperature": dict(temperature=0.8),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "top_k": dict(temperature=1.3, top_k=3),
}


def target_probs(logits: np.ndarray, temperature: float, top_p=1.0, top_k=0) -> np.ndarray:
    """The distribution a request samples from: softmax at ``temperature``, then the top-k
    tokens, then the fewest (by rank) whose probability reaches ``top_p``, renormalised."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros_like(p, dtype=bool)
    ranked = p[order]
    kept = (np.cumsum(ranked) - ranked) < top_p
    if top_k:
        kept[top_k:] = False
    keep[order[kept]] = True
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def _assert_follows(counts: np.ndarray, probs: np.ndarray) -> None:
    """Chi-square goodness of fit; tokens expected fewer than 5 times share one cell."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the target's support: {counts}"
    expected = probs * counts.sum()
    rare = support & (expected < 5)
    cells = support & ~rare
    observed = np.append(counts[cells], counts[rare].sum())
    wanted = np.append(expected[cells], expected[rare].sum())
    if not rare.any():
        observed, wanted = observed[:-1], wanted[:-1]
    assert chisquare(observed, wanted).pvalue > SIGNIFICANCE, (observed, wanted)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_verification_rule_emits_the_targets_distribution(name):
    """Row 0 (the request's next token) and row 1 (after a draft d) sampled by the engine's
    sampler for 3,000 seeds: the first emitted token follows p0, and when d is accepted, the
    second follows p1 (the target after d). d is a middling token, so both branches happen."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, size=(2, 8)).astype(np.float32)
    settings = FILTERS[name]
    p0, p1 = (target_probs(row, **settings) for row in logits)
    draft = int(np.argsort(-p0)[1])
    rows, draws = [], 3000
    for seed in range(draws):
        request = make_request([1, 2, 3])
        request.params = SamplingParams(max_tokens=8, **settings)
        request.seed = seed
        rows += [request, DraftRow(request, [draft], None)]
    tokens = np.array(sample(mx.array(np.tile(logits, (draws, 1))), rows).tokens).reshape(-1, 2)
    emitted = [t[: emitted_rows([draft], list(t))] for t in tokens]
    first = np.bincount([e[0] for e in emitted], minlength=8)
    second = np.bincount([e[1] for e in emitted if len(e) == 2], minlength=8)
    assert 0.1 * draws < first[draft] < 0.9 * draws  # accepted often, rejected often
    _assert_follows(first, p0)
    _assert_follows(second, p1)


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


def _engine(model, tokenizer, speculative="off", draft=None, **config) -> Engine:
    settings = dict(num_blocks=128, block_size=8, max_num_seqs=8)
    settings.update(config)
    return Engine(
        model, tokenizer, EngineConfig(speculative=speculative, **settings), draft_model=draft
    )


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_engine_tokens_after_a_verified_draft_follow_the_target(
    model, tiny_tokenizer, eager_speculation, name
):
    """600 seeded requests whose second token is verified against the target's own greedy
    draft: given the first token, the second follows the target's distribution (mlx-lm's
    forward, filtered in numpy)."""
    settings = FILTERS[name]
    prompt = [40, 41, 42, 43, 44]
    engine = _engine(model, tiny_tokenizer, "draft", model, num_speculative_tokens=1)
    params = [
        SamplingParams(max_tokens=3, ignore_eos=True, seed=seed, **settings) for seed in range(600)
    ]
    outputs = [out.token_ids for out in engine.generate([prompt] * len(params), params)]
    assert engine.stats().speculation.verifications >= len(params)
    first = max(set(o[0] for o in outputs), key=[o[0] for o in outputs].count)
    seconds = [o[1] for o in outputs if o[0] == first]
    logits = model(mx.array([prompt + [first]]))[0, -1]
    probs = target_probs(np.array(logits.astype(mx.float32)), **settings)
    _assert_follows(np.bincount(seconds, minlength=len(probs)), probs)


@pytest.mark.parametrize("drafter", ["ngram", "draft-same", "draft-other"])
def test_seeded_samples_are_the_same_with_and_without_speculation(model, tiny_tokenizer, drafter):
    """Row j of a verification samples with the key of the reply's token j, so a seeded
    request's tokens (and logprobs) are the ones it gets without speculation: four samples of
    one prompt (n=4), penalties, top-p, top-k, logprobs."""
    prompt = [90 + (i % 5) for i in range(17)]
    base = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2)
    params = [
        replace(base, temperature=0.9, seed=seed)
        for seed in range(4)  # n=4
    ] + [
        replace(base, temperature=0.7, top_p=0.8, seed=11),
        replace(base, temperature=1.2, top_k=5, seed=12),
        replace(base, temperature=0.8, repetition_penalty=1.2, presence_penalty=0.3, seed=13),
        replace(base, temperature=0),
    ]
    draft = {"draft-same": model, "draft-other": build_model("llama", seed=3)}.get(drafter)
    mode = "ngram" if draft is None else "draft"
    off = _engine(model, tiny_tokenizer).generate([prompt] * len(params), params)
    engine = _engine(model, tiny_tokenizer, mode, draft)
    on = engine.generate([prompt] * len(params), params)
    for a, b in zip(off, on):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert [list(t) for t in b.top_logprobs] == [list(t) for t in a.top_logprobs]
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.speculation.verifications > 0
    assert stats.speculation.accepted < stats.speculation.drafted  # rejections were resampled too
