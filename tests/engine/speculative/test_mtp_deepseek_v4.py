"""MTP for DeepSeek V4 (mlx-vlm's ``deepseek_v4``): its MTP layer is the block mlx-vlm's
``deepseek_v4_mtp`` drafter builds (an uncompressed window attention with sinks, its own
hyper-connections over the target's four streams, a MoE routed by score, its own
hyper-connection head), read from ``mtp.0.`` in DeepSeek's release names. It reads the target's
last block's streams; its one K/V head (the key is the value) is paged in the request's blocks,
while the target's layers keep their library caches held per request. Oracles: DeepSeek's
reference semantics of the target (mlx-vlm's forward of each whole sequence in one call,
tests/support/tiny_deepseek_v4.py: the output never changes), mlx-vlm's own
``DeepseekV4MTPDraftModel`` with the same weights on its own rotating window (the drafts
themselves), and the weights the test wrote (loading)."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.speculative.mtp_weights import mtp_layer_count, mtp_refusal
from macbatch.engine.stores.pages import LayerShape
from tests.support.mtp import (
    MTP_SETTINGS,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mtp_engine,
    recorded_proposals,
)
from tests.support.mtp_deepseek_v4 import (
    drafter_v4_drafts,
    mlx_vlm_v4_drafts,
    predicting_v4_head,
    random_v4_head,
    save_v4_checkpoint,
)
from tests.support.mtp_fp8 import assert_dequantized, v4_release_layer
from tests.support.oracle import assert_pool_idle
from tests.support.sampling_oracle import assert_sampled_after_a_draft_follow
from tests.support.tiny_deepseek_v4 import CONFIG, deepseek_v4_model, reference_greedy

pytest.importorskip("mlx_vlm")


def _reference(model, prompts=PROMPTS, max_tokens=16):
    return [reference_greedy(model, p, max_tokens) for p in prompts]


def test_deepseek_v4_drafts_with_mtp_and_v41_says_why_not() -> None:
    assert mtp_refusal("deepseek_v4") is None
    assert "V4.1 block" in (mtp_refusal("deepseek_v41") or "")


def test_greedy_outputs_are_the_references_with_a_prefix_cache_hit(tiny_tokenizer):
    """Five requests of staggered lengths in flight (contexts past the window of 8: the MTP
    layer's window drops positions too), prompts chunked by a 16-token budget, drafts mostly
    accepted (a layer predicting the target's next token); then each one's next turn (its
    prompt, its reply, three more tokens), which resumes from the held caches' checkpoint at
    the reply's last block boundary. Its pages: one K/V head of ``head_dim``."""
    model = deepseek_v4_model()
    head = predicting_v4_head(model)
    expected = _reference(model)
    engine = mtp_engine(model, tiny_tokenizer, head)
    assert engine.runner.draft.store.shapes == [LayerShape(1, CONFIG["head_dim"])]
    assert greedy_ids(engine) == expected
    spec = engine.stats().speculation
    assert spec.drafted > 0 and spec.accepted > spec.drafted / 2
    turns = [p + out + [5, 6, 7] for p, out in zip(PROMPTS, expected)]
    assert greedy_ids(engine, turns) == _reference(model, turns)
    assert engine.stats().prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


def test_a_mixed_batch_preempted_still_replies_as_the_reference(tiny_tokenizer):
    """Requests that opt out beside ones that speculate, in 12 blocks of 8: some are preempted
    and recomputed (their held caches from the first token, their MTP rows rewritten by the
    next catch-up)."""
    model = deepseek_v4_model()
    engine = mtp_engine(model, tiny_tokenizer, predicting_v4_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == _reference(model, prompts)
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.preemptions > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("predicting", [False, True])
def test_drafts_are_mlx_vlms_drafters(predicting, tiny_tokenizer, eager_speculation):
    """Every proposal equals what mlx-vlm's own drafter with the same weights drafts from the
    streams of mlx-vlm's forward of the request's tokens: a random layer (its mixes, sinks and
    router bias random too; drafts of one: they fail) and the predicting one (drafts of three,
    each fed the layer's own streams). The replies stay the reference's."""
    model = deepseek_v4_model()
    head = predicting_v4_head(model) if predicting else random_v4_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == _reference(model)
    assert len(proposals) > 10
    assert max(len(d) for _, d in proposals) == (3 if predicting else 1)
    for tokens, drafts in proposals:
        assert drafts == mlx_vlm_v4_drafts(model, head, tokens, len(drafts))


def test_a_checkpoint_with_its_mtp_layer_loads_and_drafts(tmp_path):
    """A checkpoint with its MTP layer under ``mtp.0.`` in DeepSeek's release names: ``auto``
    drafts with it, with exactly the weights written, and the replies are the reference's of
    the same checkpoint (mlx-vlm's ``sanitize`` drops ``mtp.*``); the doctor counts one layer."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "deepseek_v4"
    expected = save_v4_checkpoint(path).expected
    assert mtp_layer_count(path) == (1, 1)  # what the doctor counts
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == _reference(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0


# dimensions the release's formats fit: every projection's inputs a multiple of 32
MX_SHAPES = {"moe_intermediate_size": 32, "q_lora_rank": 32, "o_lora_rank": 16}


def test_a_release_checkpoint_in_fp8_and_fp4_loads_and_drafts(tmp_path):
    """The MTP layer stored as DeepSeek V4's release stores it (routed experts in fp4 with an
    E8M0 ``.scale`` per 32 inputs, the other projections in e4m3 with one per 128 x 128 block,
    typed I8 / F8_E4M3 / F8_E8M0; ``quantization_config`` fp8 with ``scale_fmt`` ue8m0), encoded
    by the float64 numpy oracle of the formats: ``--speculative mtp`` loads it as MLX's mxfp4 /
    mxfp8 layers holding exactly the oracle's codes and scales, each weight dequantized by its
    layer's own mode is the oracle's value, and the replies are the reference's."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "deepseek_v4"
    layer = save_v4_checkpoint(path, v4_release_layer, **MX_SHAPES)
    engine = Engine.load(str(path), EngineConfig(speculative="mtp", **MTP_SETTINGS))
    head = engine.runner.draft.head
    assert_mtp_weights(engine, layer.expected)
    assert_dequantized(head, layer)
    modes = {m.mode for _, m in head.named_modules() if hasattr(m, "scales")}
    assert modes == {"mxfp4", "mxfp8"}
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == _reference(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0


# the shapes mlx-vlm's own drafter loads a release layer in: each 128 x 128 block whole
RELEASE_SHAPES = {**MX_SHAPES, "hidden_size": 128, "moe_intermediate_size": 128,
                  "q_lora_rank": 128, "o_lora_rank": 64, "head_dim": 128}  # fmt: skip


def test_a_release_checkpoints_drafts_are_mlx_vlms_drafters(tmp_path, eager_speculation):
    """The same release layout in the shapes mlx-vlm reads it in (whole 128 x 128 blocks):
    mlx-vlm's ``load_drafter`` loads the same checkpoint as its own mxfp4 / mxfp8 drafter, and
    every proposal macbatch's loaded layer makes equals that drafter's from the streams of
    mlx-vlm's forward; the replies stay the reference's."""
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.utils import load_model

    path = tmp_path / "deepseek_v4"
    layer = save_v4_checkpoint(path, v4_release_layer, **RELEASE_SHAPES)
    config = EngineConfig(speculative="mtp", enable_prefix_caching=False, **MTP_SETTINGS)
    engine = Engine.load(str(path), config)
    assert_dequantized(engine.runner.draft.head, layer)
    proposals = recorded_proposals(engine)
    model, (drafter, _) = load_model(path), load_drafter(str(path))
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == _reference(model, prompts, 12)
    assert len(proposals) > 5
    for tokens, drafts in proposals:
        assert drafts == drafter_v4_drafts(drafter, model, tokens, len(drafts))


def test_sampled_tokens_after_a_verified_draft_follow_the_target(tiny_tokenizer, eager_speculation):
    """400 seeded requests at temperature 1 whose second token is verified against an MTP
    draft: given the first token, the second follows the target's distribution (mlx-vlm's
    forward of the whole sequence; chi-square at significance 0.001). The tiny target's LM
    head is scaled up 8x: its own is so flat that no next token is common enough to test."""
    model = deepseek_v4_model()
    lm_head = model.language_model.lm_head
    lm_head.weight = lm_head.weight * 8
    head = predicting_v4_head(model)  # most drafts held
    engine = mtp_engine(model, tiny_tokenizer, head, num_blocks=256, max_num_seqs=8)
    assert_sampled_after_a_draft_follow(engine, model, [40, 41, 42, 43, 44])
