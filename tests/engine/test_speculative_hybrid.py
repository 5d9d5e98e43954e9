"""Speculation on hybrid models: a verification's recurrent state must end at the last accepted
token. The state after the chunk's first token is kept in a snapshot slot and put back when a
draft is rejected (the accepted drafts are recomputed). Oracle: mlx-lm's greedy generation, and
the same seeded requests without speculation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import HYBRID_CONFIGS, build_model

PROMPTS = [
    [40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41],
    [90 + (i % 3) for i in range(21)],
    [200, 17, 33, 250, 8, 300, 120, 64, 5],
]
MAX_TOKENS = 16


def _engine(model, tokenizer, speculative="off", draft=None, **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    config = EngineConfig(speculative=speculative, num_speculative_tokens=3, **settings)
    return Engine(model, tokenizer, config, draft_model=draft)


class ReplayDrafter:
    """Proposes the reference continuation of each prompt (mlx-lm's greedy tokens): every
    draft holds, so no state is restored. A draft model must be attention-only, so a hybrid
    target cannot draft for itself; this stands in for a perfect draft."""

    def __init__(self, references: dict[tuple[int, ...], list[int]], spoil: int = 0) -> None:
        self.references = references
        self.spoil = spoil  # every spoil-th reply position gets a wrong draft (0: none)

    def propose(self, requests, ks):
        return [self._next(r.prompt_token_ids, r.output_token_ids, k) for r, k in zip(requests, ks)]

    def _next(self, prompt, output, k):
        drafts = self.references[tuple(prompt)][len(output) : len(output) + k]
        if self.spoil:
            drafts = [t if (len(output) + j) % self.spoil else t + 1 for j, t in enumerate(drafts)]
        return drafts

    def truncated(self, request_id, num_tokens):
        pass

    def forget(self, request_id):
        pass


@pytest.mark.parametrize("arch", sorted(HYBRID_CONFIGS))
@pytest.mark.parametrize("drafter", ["ngram", "replay", "draft-other"])
def test_greedy_outputs_are_mlx_lms(arch, drafter, tiny_tokenizer):
    """Prompt lookup (it drafts where the reply repeats), the reference itself (every draft
    holds: no restore) and a random draft model (most rejected: restored states)."""
    model = build_model(arch)
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    draft = build_model("llama", seed=3) if drafter == "draft-other" else None
    engine = _engine(model, tiny_tokenizer, "draft" if draft else "ngram", draft)
    if drafter == "replay":
        engine.speculator.drafter = ReplayDrafter({tuple(p): e for p, e in zip(PROMPTS, expected)})
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    outs = [o.token_ids for o in engine.generate(PROMPTS, params)]
    assert outs == expected
    assert_pool_idle(engine)
    spec = engine.stats().speculation
    if drafter == "replay":
        assert spec.verifications > 0 and spec.accepted == spec.drafted
    if drafter == "draft-other":
        assert spec.verifications > 0 and spec.accepted < spec.drafted


def test_seeded_samples_and_prefix_cache_with_restored_states(tiny_tokenizer):
    model = build_model("qwen3_5")
    base = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    params = [replace(base, temperature=0.5, seed=s) for s in range(3)]
    off = _engine(model, tiny_tokenizer).generate(PROMPTS, params)
    # the seeded samples themselves, every third one spoiled: accepted runs, then a rejection
    engine = _engine(model, tiny_tokenizer, "ngram")
    replies = {tuple(p): o.token_ids for p, o in zip(PROMPTS, off)}
    engine.speculator.drafter = ReplayDrafter(replies, spoil=3)
    for _ in range(2):  # again: from the prefix cache's checkpoints
        on = engine.generate(PROMPTS, params)
        assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert engine.stats().prefix_cache_hit_rate > 0
    spec = engine.stats().speculation
    assert 0 < spec.accepted < spec.drafted
