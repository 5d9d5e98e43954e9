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


@pytest.mark.parametrize("arch", sorted(HYBRID_CONFIGS))
@pytest.mark.parametrize("drafter", ["ngram", "draft-same", "draft-other"])
def test_greedy_outputs_are_mlx_lms(arch, drafter, tiny_tokenizer):
    """Prompt lookup (it drafts where the reply repeats), the target drafting for itself (every
    draft holds: no restore) and a random draft model (most rejected: restored states)."""
    model = build_model(arch)
    draft = {"draft-same": model, "draft-other": build_model("llama", seed=3)}.get(drafter)
    engine = _engine(model, tiny_tokenizer, "draft" if draft else "ngram", draft)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    outs = [o.token_ids for o in engine.generate(PROMPTS, params)]
    assert outs == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert_pool_idle(engine)
    spec = engine.stats().speculation
    if drafter == "draft-same":
        assert spec.verifications > 0 and spec.accepted == spec.drafted
    if drafter == "draft-other":
        assert spec.verifications > 0 and spec.accepted < spec.drafted


def test_seeded_samples_and_prefix_cache_with_restored_states(tiny_tokenizer):
    model = build_model("qwen3_5")
    base = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    params = [replace(base, temperature=0.5, seed=s) for s in range(3)]
    draft = model  # its greedy drafts: often but not always what the seeded samples are
    off = _engine(model, tiny_tokenizer).generate(PROMPTS, params)
    engine = _engine(model, tiny_tokenizer, "draft", draft)
    for _ in range(2):  # again: from the prefix cache's checkpoints
        on = engine.generate(PROMPTS, params)
        assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert engine.stats().prefix_cache_hit_rate > 0
    spec = engine.stats().speculation
    assert 0 < spec.accepted < spec.drafted
