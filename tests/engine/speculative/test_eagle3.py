"""Eagle-3 drafting: one layer over fused target features proposes a request's drafts one packed
forward per token, as an MTP layer does, its K/V in the request's blocks. Oracles: mlx-lm's
greedy generation of the target (the output never changes), and mlx-vlm's own Eagle-3 drafter
given the same weights (the drafts themselves)."""

from __future__ import annotations

import mlx.nn as nn
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.drafters import load_draft_model
from macbatch.engine.speculative.eagle3_model import Eagle3Model
from macbatch.engine.speculative.policy import SpeculationPolicy
from macbatch.models.check import check_model
from tests.support.eagle3 import (
    agreeing_eagle3,
    mlx_vlm_drafts,
    random_eagle3,
    save_eagle3_checkpoint,
)
from tests.support.mtp import PROMPTS, mtp_target, recorded_proposals, save_hf_checkpoint
from tests.support.oracle import assert_mixed_batch_exact, assert_pool_idle, mlx_lm_greedy
from tests.support.sampling_oracle import assert_sampled_after_a_draft_follow
from tests.support.tiny import build_model, save_model

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def dense():
    """A dense target (qwen3) and the drafter built to agree with it (which scales it)."""
    model = build_model("qwen3")
    return model, agreeing_eagle3(model)


@pytest.fixture(scope="module")
def hybrid():
    """A hybrid target (qwen3_5: Gated DeltaNet beside attention) and its agreeing drafter."""
    model = mtp_target("qwen3_5")
    return model, agreeing_eagle3(model)


def _engine(model, tokenizer, drafter, **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    return Engine(
        model, tokenizer, EngineConfig(speculative="eagle3", **settings), draft_model=drafter
    )


def _greedy(engine: Engine, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


@pytest.mark.parametrize("target", ["dense", "hybrid"])
def test_agreeing_drafter_is_accepted_and_exact(target, request, tiny_tokenizer):
    """Five requests in flight, prompts chunked by a 16-token budget: most drafts of the
    drafter built to agree hold, and the replies are mlx-lm's."""
    model, drafter = request.getfixturevalue(target)
    engine = _engine(model, tiny_tokenizer, drafter)
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert_pool_idle(engine)
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted >= spec.verifications / 2


def test_drafts_are_mlx_vlms(tmp_path, tiny_tokenizer, eager_speculation, monkeypatch):
    """A random drafter over half the target's vocabulary, saved in SGLang's checkpoint layout
    and loaded by the engine's draft loader, proposes at every proposal exactly what mlx-vlm's
    Eagle-3 drafter with the same weights proposes over mlx-lm's layer outputs (the paged K/V,
    positions, the fused features, the chain of drafts and the vocabulary map are the
    drafter's), and its rejected drafts leave the replies mlx-lm's. (Every request is expected
    to draft soon, so no prompt pass is skipped.)"""
    monkeypatch.setattr(
        SpeculationPolicy,
        "drafting_soon",
        lambda self, requests, batch: {r.request_id for r in requests},
    )
    model = build_model("qwen3")
    vocab = int(model.args.vocab_size)
    path = save_eagle3_checkpoint(
        tmp_path / "eagle3", random_eagle3(model, draft_vocab=vocab // 2), model
    )
    drafter = load_draft_model(str(path))
    assert isinstance(drafter, Eagle3Model)
    engine = _engine(model, tiny_tokenizer, drafter)
    proposals = recorded_proposals(engine)
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert len(proposals) >= len(PROMPTS)
    assert len({d for _, drafts in proposals for d in drafts}) > 3
    for tokens, drafts in proposals:
        assert drafts == mlx_vlm_drafts(path, model, tokens, len(drafts))


def test_rejected_drafts_on_a_hybrid_leave_outputs_unchanged(
    hybrid, tiny_tokenizer, eager_speculation
):
    """A random drafter on the hybrid target: its drafts fail, the recurrent states roll back,
    and the replies are mlx-lm's."""
    model, _ = hybrid
    engine = _engine(model, tiny_tokenizer, random_eagle3(model))
    prompts = PROMPTS[:3]
    assert _greedy(engine, prompts) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in prompts]
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted < spec.drafted


def test_a_4bit_checkpoint_loads_quantized_and_keeps_outputs(tmp_path, tiny_tokenizer):
    """An MLX-converted (4-bit) drafter: its config's ``quantization`` quantizes the module
    before its weights load, and the replies stay mlx-lm's."""
    model = build_model("qwen3")
    drafter = random_eagle3(model)
    nn.quantize(drafter, 32, 4)
    quantization = {"group_size": 32, "bits": 4}
    path = save_eagle3_checkpoint(tmp_path / "q4", drafter, model, quantization=quantization)
    loaded = load_draft_model(str(path))
    assert isinstance(loaded.midlayer.self_attn.q_proj, nn.QuantizedLinear)
    engine = _engine(model, tiny_tokenizer, loaded)
    prompts = PROMPTS[:2]
    assert _greedy(engine, prompts) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in prompts]


def test_mixed_batch_preemption_and_prefix_hits(hybrid, tiny_tokenizer, eager_speculation):
    """On the hybrid target: requests that opt out beside ones that speculate, a pool small
    enough to preempt, and prompts that repeat (prefix-cache hits, their blocks' drafter K/V
    written by another request): every reply is mlx-lm's."""
    model, drafter = hybrid
    prompts = PROMPTS + PROMPTS[:3]
    engine = _engine(model, tiny_tokenizer, drafter, num_blocks=16)
    assert_mixed_batch_exact(engine, model, prompts, MAX_TOKENS)


def test_sampled_tokens_after_a_verified_draft_follow_the_target(tiny_tokenizer, eager_speculation):
    """400 seeded requests at temperature 1 whose second token is verified against an Eagle-3
    draft: given the first token, the second follows the target's distribution."""
    model = build_model("qwen3")
    drafter = agreeing_eagle3(model, scale=0.3)  # a spread-out target, drafts often held
    engine = _engine(model, tiny_tokenizer, drafter, num_blocks=256, max_num_seqs=8)
    assert_sampled_after_a_draft_follow(engine, model, [40, 41, 42, 43, 44])


def test_auto_detects_an_eagle3_draft_model(tmp_path):
    """``--speculative auto`` with ``--draft-model`` naming an Eagle-3 checkpoint, on a target
    without MTP heads, drafts with Eagle-3 (its config says what it is); stats (and /metrics)
    name the drafter; doctor says what the checkpoint is. On a target with MTP heads, they
    draft."""
    model = build_model("qwen3")
    target = save_model(tmp_path / "target", "qwen3")
    path = save_eagle3_checkpoint(tmp_path / "eagle3", random_eagle3(model), model)
    engine = Engine.load(str(target), EngineConfig(speculative="auto", draft_model=str(path)))
    assert engine.config.speculative == "eagle3" and engine.stats().drafter == "eagle3"
    assert engine.config.draft_length == 4
    report = check_model(str(path))
    assert report.problem is None
    assert "Eagle-3" in dict(report.rows)["drafter"]
    # a checkpoint's own MTP heads come first
    heads = tmp_path / "heads"
    save_hf_checkpoint(heads, "qwen3_5")
    hybrid = mtp_target("qwen3_5")
    drafter = save_eagle3_checkpoint(tmp_path / "e3", random_eagle3(hybrid), hybrid)
    config = EngineConfig(speculative="auto", draft_model=str(drafter))
    assert Engine.load(str(heads), config).config.speculative == "mtp"
