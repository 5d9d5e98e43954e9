"""An MTP engine of a non-hybrid family (DeepSeek V3 and GLM-4.7-Flash over latent pages,
GLM-4.5 over GQA pages) runs its plain decode steps through the compiled decode step
(engine/worker/compiled_step.py), which returns the step's hidden states beside its logits for
the MTP layer. Oracles: mlx-lm's greedy generation (the replies), the MTP layer run unpaged over
mlx-lm's hidden states (every proposal, those fed compiled steps' hidden states included), and
the uncompiled forward's hidden states on the same step (bit for bit)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.mtp import (
    NEXTN_ARCHS,
    PROMPTS,
    compiled_steps_at_proposals,
    mtp_target,
    random_mtp_head,
    recorded_proposals,
    unpaged_drafts,
)
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy

MAX_TOKENS = 40
# DeepSeek Sparse Attention plans its selection on the host: those steps never run compiled
COMPILED_ARCHS = sorted(set(NEXTN_ARCHS) - {"deepseek_v32", "glm_moe_dsa"})
CONFIG = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16, compile_decode_after=0)


def _engine(model, tokenizer, **config) -> Engine:
    settings = dict(CONFIG, enable_prefix_caching=False) | config
    config = EngineConfig(speculative="mtp", num_speculative_tokens=3, **settings)
    return Engine(model, tokenizer, config, draft_model=random_mtp_head(model))


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_plain_decode_steps_run_compiled_and_drafts_stay_the_mtp_layers(arch, tiny_tokenizer):
    """A random MTP layer's drafts are rejected, so its requests rest and decode plainly between
    probes: those steps run compiled, the replies are mlx-lm's, and each probe after compiled
    steps (its catch-up reads their hidden states) proposes what the unpaged layer does."""
    model = mtp_target(arch)
    engine = _engine(model, tiny_tokenizer)
    proposals = recorded_proposals(engine)
    compiled, at_proposal = compiled_steps_at_proposals(engine)  # compiled steps per proposal
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert engine.runner.compiled.compiled_shapes > 0 and compiled[0] > 0
    after = [(tokens, drafts) for (tokens, drafts), n in zip(proposals, at_proposal) if n]
    assert len(after) >= 2, str((at_proposal, compiled[0]))
    for tokens, drafts in proposals:
        assert drafts == unpaged_drafts(model, engine.runner.draft.head, tokens, len(drafts))
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ["glm4_moe", "deepseek_v3"])
def test_compiled_hidden_states_equal_uncompiled(arch, tiny_tokenizer):
    """On the same decode step of an MTP engine, the compiled step's hidden states and logits
    equal the uncompiled forward's bit for bit (one request, then three), and the runner keeps
    the compiled ones for the MTP layer."""
    model = mtp_target(arch)
    engine = _engine(model, tiny_tokenizer, pipelined=False)
    runner = engine.runner
    for count in (1, 3):
        for prompt in PROMPTS[:count]:
            engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0))
        while not all(r.num_generated > 2 for r in engine._requests.values()):
            engine.step()
        plan = engine.scheduler.schedule()
        batch = engine._pack(plan, None)
        assert batch.num_tokens == count  # a plain decode step: nobody drafts in it
        logits, _ = runner.forward(batch)
        kept = runner.hidden
        hidden = runner.adapter.hidden_states(batch, runner.kv_stores)  # the same K/V again
        plain = runner.adapter.sampled_logits(hidden, batch)
        assert kept is not None and plain is not None and logits is not None
        assert mx.array_equal(kept, hidden).item() and mx.array_equal(logits, plain).item()
        for request_id in list(engine._requests):
            engine.abort(request_id)
        engine.step()
    assert runner.compiled is not None and runner.compiled.compiled_shapes == 2
