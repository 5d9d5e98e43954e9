"""MTP drafting: a checkpoint's own multi-token-prediction layer drafts from the target's hidden
states, its K/V in the target's blocks. Oracles: mlx-lm's greedy generation of the target (the
output never changes), the same seeded requests without speculation, scipy's chi-square against
the target's distribution (mlx-lm's forward), and the MTP layer run unpaged over mlx-lm's own
hidden states (the drafts themselves)."""

from __future__ import annotations

from dataclasses import replace

import mlx.nn as nn
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.adapter import text_model
from macbatch.engine.speculative.mtp_model import MtpHead
from tests.support.mtp import (
    MTP_ARCHS,
    PROMPTS,
    mtp_target,
    predicting_mtp_head,
    random_mtp_head,
    recorded_proposals,
    unpaged_drafts,
)
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.sampling_oracle import assert_sampled_after_a_draft_follow

MAX_TOKENS = 16


def _engine(model, tokenizer, head, speculative="mtp", **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    config = EngineConfig(speculative=speculative, num_speculative_tokens=3, **settings)
    return Engine(model, tokenizer, config, draft_model=head)


def _greedy(engine: Engine, prompts=PROMPTS) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


def _quantized(model: nn.Module, head: MtpHead) -> None:
    nn.quantize(model, 32, 4)
    nn.quantize(head, 32, 4)


@pytest.mark.parametrize("arch", sorted(MTP_ARCHS))
@pytest.mark.parametrize("bits", [None, 4])
def test_greedy_outputs_are_mlx_lms(arch, bits, tiny_tokenizer):
    """Five requests in flight, prompts chunked by a 16-token budget, drafts mostly accepted and
    sometimes rejected (a hybrid's recurrent state resumed from its snapshot)."""
    model = mtp_target(arch)
    head = predicting_mtp_head(model)
    if bits:
        _quantized(model, head)
    engine = _engine(model, tiny_tokenizer, head)
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert_pool_idle(engine)
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted > spec.drafted / 2


@pytest.mark.parametrize("arch", sorted(MTP_ARCHS))
def test_rejected_drafts_leave_outputs_unchanged(arch, tiny_tokenizer):
    model = mtp_target(arch)
    engine = _engine(model, tiny_tokenizer, random_mtp_head(model))
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted < spec.drafted / 2


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_drafts_are_the_mtp_layers_own(arch, tiny_tokenizer, eager_speculation):
    """Every proposal equals the MTP layer run unpaged (mlx-lm's KV cache, a causal mask) over
    mlx-lm's hidden states of the request's tokens, then fed its own output and drafts: the
    paged catch-up, positions and pages are the layer's. (Eager: the random layer's failures
    must not stop a later request's prompt pass, which the unpaged layer attends to.)"""
    model = mtp_target(arch)
    head = random_mtp_head(model)
    engine = _engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    _greedy(engine)
    assert len(proposals) > 10
    for tokens, drafts in proposals:
        assert drafts == unpaged_drafts(model, head, tokens, len(drafts))


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("num_blocks", [10, 64])  # 10 blocks of 8: requests are preempted
def test_preemption_and_prefix_cache_hits(arch, num_blocks, tiny_tokenizer):
    model = mtp_target(arch)
    head = predicting_mtp_head(model)
    engine = _engine(model, tiny_tokenizer, head, num_blocks=num_blocks)
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert _greedy(engine) == expected
    if num_blocks == 10:
        assert engine.stats().preemptions > 0
    else:
        assert _greedy(engine) == expected  # again: the prompts' blocks from the prefix cache
        assert engine.stats().prefix_cache_hit_rate > 0
    assert engine.stats().speculation.accepted > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_seeded_samples_are_the_same_with_and_without_mtp(arch, tiny_tokenizer):
    """A seeded request's tokens and logprobs are the ones it gets without speculation."""
    model = mtp_target(arch)
    head = predicting_mtp_head(model)
    base = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2)
    params = [replace(base, temperature=0.9, seed=seed) for seed in range(4)] + [
        replace(base, temperature=0.7, top_p=0.8, seed=11),
        replace(base, temperature=1.2, top_k=5, seed=12),
        replace(base, temperature=0.8, repetition_penalty=1.2, seed=13),
    ]
    prompts = [PROMPTS[0]] * 4 + PROMPTS[1:4]
    off = _engine(model, tiny_tokenizer, None, "off").generate(prompts, params)
    engine = _engine(model, tiny_tokenizer, head)
    on = engine.generate(prompts, params)
    for a, b in zip(off, on):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted < spec.drafted
    if text_model(model).args.tie_word_embeddings:  # a peaked target: samples hold drafts too
        assert spec.accepted > 0


def test_sampled_tokens_after_a_verified_draft_follow_the_target(tiny_tokenizer, eager_speculation):
    """400 seeded requests at temperature 1 whose second token is verified against an MTP
    draft: given the first token, the second follows the target's distribution (mlx-lm's
    forward; chi-square at significance 0.001)."""
    model = mtp_target("qwen3_5")
    head = predicting_mtp_head(model, scale=0.3)  # a spread-out target, drafts often held
    prompt = [40, 41, 42, 43, 44]
    engine = _engine(model, tiny_tokenizer, head, num_blocks=256, max_num_seqs=8)
    assert_sampled_after_a_draft_follow(engine, model, prompt)
