"""A drafter that reads the target's layer outputs (DFlash, Eagle-3: speculative/layer_taps.py)
keeps the compiled decode step (engine/worker/compiled_step.py): the graph returns the tapped
layers' outputs, which a replay would not record. Oracles: mlx-lm's greedy generation (the
replies), mlx-vlm's own drafter loaded from the same checkpoint over mlx-lm's layer outputs
(every proposal, those fed compiled steps' outputs included), and the uncompiled forward's
recorded features on the same step (bit for bit)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.drafters import load_draft_model
from macbatch.engine.speculative.policy import SpeculationPolicy
from tests.support import dflash, eagle3
from tests.support.mtp import PROMPTS, compiled_steps_at_proposals, recorded_proposals
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import build_model

MAX_TOKENS = 24
CONFIG = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16, compile_decode_after=0)


def _dflash(path: Path, model: nn.Module) -> Path:
    return dflash.save_dflash_checkpoint(path, dflash.random_dflash(model, gain=5.0), model)


def _eagle3(path: Path, model: nn.Module) -> Path:
    drafter = eagle3.random_eagle3(model, draft_vocab=int(model.args.vocab_size) // 2)
    return eagle3.save_eagle3_checkpoint(path, drafter, model)


# each method: a random drafter saved as its checkpoint, and mlx-vlm's drafts from that checkpoint
DRAFTERS: dict[str, tuple[Callable[[Path, nn.Module], Path], Callable[..., list[int]]]] = {
    "dflash": (_dflash, dflash.mlx_vlm_drafts),
    "eagle3": (_eagle3, eagle3.mlx_vlm_drafts),
}


def _engine(method: str, tmp_path: Path, tokenizer: Any, **config: Any) -> tuple[Engine, Path]:
    """A qwen3 target's engine drafting with a random ``method`` drafter loaded from its
    checkpoint (the checkpoint's path returned for mlx-vlm's drafter)."""
    model = build_model("qwen3")
    path = DRAFTERS[method][0](tmp_path / method, model)
    settings = dict(CONFIG, enable_prefix_caching=False) | config
    engine = Engine(
        model,
        tokenizer,
        EngineConfig(speculative=method, **settings),
        draft_model=load_draft_model(str(path)),
    )
    return engine, path


@pytest.mark.parametrize("method", sorted(DRAFTERS))
def test_plain_decode_steps_run_compiled_and_drafts_stay_mlx_vlms(
    method, tmp_path, tiny_tokenizer, eager_speculation, monkeypatch
):
    """A random drafter's drafts are rejected, so its requests rest and decode plainly between
    probes: those steps run compiled, the replies are mlx-lm's, and each proposal after compiled
    steps (its context read from their tapped outputs) is what mlx-vlm's drafter proposes.
    (Every request is expected to draft soon, so no prompt pass is skipped.)"""
    monkeypatch.setattr(
        SpeculationPolicy,
        "drafting_soon",
        lambda self, requests, batch: {r.request_id for r in requests},
    )
    engine, path = _engine(method, tmp_path, tiny_tokenizer)
    model = engine.runner.model
    proposals = recorded_proposals(engine)
    compiled, at_proposal = compiled_steps_at_proposals(engine)  # compiled steps per proposal
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert compiled[0] > 0
    after = [(tokens, drafts) for (tokens, drafts), n in zip(proposals, at_proposal) if n]
    assert len(after) >= 2, str((at_proposal, compiled[0]))
    for tokens, drafts in after:
        assert drafts == DRAFTERS[method][1](path, model, tokens, len(drafts))
    assert_pool_idle(engine)


@pytest.mark.parametrize("method", sorted(DRAFTERS))
def test_compiled_features_equal_uncompiled(method, tmp_path, tiny_tokenizer):
    """On the same decode step, the features the runner keeps for the drafter from the compiled
    step, and its logits, equal the uncompiled forward's bit for bit (one request, then three)."""
    engine, _ = _engine(method, tmp_path, tiny_tokenizer, pipelined=False)
    runner = engine.runner
    for count in (1, 3):
        for prompt in PROMPTS[:count]:
            engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0))
        while not all(r.num_generated > 2 for r in engine._requests.values()):
            engine.step()
        plan = engine.scheduler.schedule()
        batch = engine._pack(plan, None)
        assert batch.num_tokens == count  # a plain decode step
        logits, _ = runner.forward(batch)
        kept = runner.hidden
        hidden = runner.adapter.hidden_states(batch, runner.kv_stores)  # the same K/V again
        plain = runner.adapter.sampled_logits(hidden, batch)
        features = runner.draft.features(hidden)
        assert kept is not None and plain is not None and logits is not None
        assert mx.array_equal(kept, features).item() and mx.array_equal(logits, plain).item()
        for request_id in list(engine._requests):
            engine.abort(request_id)
        engine.step()
    assert runner.compiled is not None and runner.compiled.compiled_shapes == 2
