"""MTP for Qwen4-exp (mlx-vlm's ``qwen4_exp``): its MTP layer, under ``mtp.`` (``fc_embedding``,
``fc_hidden``, ``pre_fc_norm_*``, ``layers.0.*``, ``hyper_connection_mixer``), reads the target's
two hyper-connection streams before their final mixer (its last layer's output, recorded in the
step), runs one Qwen Sparse Attention layer over them (its K/V and raw indexer keys paged in the
request's own blocks) and mixes its own streams for the LM head. The target is a hybrid (Gated
DeltaNet layers) with an n-gram per-layer embedding. Oracles: mlx-vlm's own greedy generation of
the target (the output never changes), mlx-vlm's own ``Qwen4ExpMTPDraftModel`` with the same
weights (the drafts themselves), and the weights the test wrote (loading)."""

from __future__ import annotations

import json

import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.speculative.mtp_model import load_mtp_head
from macbatch.engine.stores.pages import LayerShape
from tests.support.mtp import (
    MTP_SETTINGS,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mlx_vlm_greedy_ids,
    mlx_vlm_qwen4_drafts,
    mtp_engine,
    predicting_streams_head,
    quantize_for_mtp,
    random_mtp_head,
    recorded_proposals,
    save_qwen4_checkpoint,
)
from tests.support.mtp_fp8 import BLOCK_FP8, assert_dequantized
from tests.support.oracle import assert_pool_idle
from tests.support.tiny_qwen4_exp import QWEN4_EXP, TEXT_CONFIG

pytest.importorskip("mlx_vlm")


@pytest.mark.parametrize("bits", [None, 4])
def test_greedy_outputs_are_mlx_vlms_with_a_prefix_cache_hit(bits, tiny_tokenizer):
    """Five requests of staggered lengths in flight (contexts past the selection's budget: the
    MTP layer reads selected blocks), prompts chunked by a 16-token budget, drafts mostly
    accepted (a target without the n-gram embedding, whose next token the layer predicts);
    then the same prompts again from the prefix cache. Its pages: K and V per head, then the
    indexer's raw key row."""
    model = QWEN4_EXP.model(ple_layer_ids=[])
    head = predicting_streams_head(model)
    if bits:
        quantize_for_mtp(model, head, bits)
    expected = mlx_vlm_greedy_ids(model)
    engine = mtp_engine(model, tiny_tokenizer, head)
    text = TEXT_CONFIG
    assert engine.runner.draft.store.shapes == [
        LayerShape(text["num_key_value_heads"], text["head_dim"]),
        LayerShape(1, text["indexer_head_dim"], value_dim=0),
    ]
    assert greedy_ids(engine) == expected
    spec = engine.stats().speculation
    # 4-bit rounding moves the tiny target's choices off what the layer predicts more often
    assert spec.drafted > 0 and spec.accepted > (spec.drafted / 2 if bits is None else 0)
    assert greedy_ids(engine) == expected
    assert engine.stats().prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


def test_a_mixed_batch_preempted_still_replies_as_mlx_vlm(tiny_tokenizer):
    """Requests that opt out beside ones that speculate, in 12 blocks of 8: some are preempted
    and recomputed (their Gated DeltaNet states from the prompt, their MTP rows rewritten by
    the next catch-up)."""
    model = QWEN4_EXP.model(ple_layer_ids=[])
    engine = mtp_engine(model, tiny_tokenizer, predicting_streams_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == mlx_vlm_greedy_ids(model, prompts)
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.preemptions > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("predicting", [False, True])
def test_drafts_are_mlx_vlms_drafters(predicting, tiny_tokenizer, eager_speculation):
    """Every proposal equals what mlx-vlm's own drafter with the same weights drafts from
    mlx-vlm's streams of the request's tokens: a random layer on the target with its n-gram
    embedding (drafts of one: they fail), and the predicting one (drafts of three, each fed the
    layer's own streams). The replies stay mlx-vlm's."""
    model = QWEN4_EXP.model(**({"ple_layer_ids": []} if predicting else {}))
    head = predicting_streams_head(model) if predicting else random_mtp_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == mlx_vlm_greedy_ids(model)
    assert len(proposals) > 10
    assert max(len(d) for _, d in proposals) == (3 if predicting else 1)
    for tokens, drafts in proposals:
        assert drafts == mlx_vlm_qwen4_drafts(model, head, tokens, len(drafts))


def test_a_checkpoint_with_its_mtp_layer_loads_and_drafts(tmp_path):
    """A checkpoint with its MTP layer under ``mtp.`` (experts fused): ``auto`` drafts with it,
    with exactly the weights written, and the replies are mlx-vlm's of the same checkpoint (its
    ``sanitize`` drops ``mtp.*``)."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "qwen4_exp"
    expected = save_qwen4_checkpoint(path)
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == mlx_vlm_greedy_ids(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0


def test_a_block_fp8_checkpoints_mtp_layer_loads_as_the_format_defines(tmp_path):
    """Qwen4-exp's real checkpoints store the MTP layer in block fp8 (DeepSeek's e4m3 codes, a
    float32 ``weight_scale_inv`` per 128 x 128 block beside each projection, experts one per
    projection; config ``quantization_config`` quant_method fp8), encoded here by the float64
    numpy oracle of the format: the layer loads dequantized to exactly the oracle's values (its
    float weights' dtype), ``auto`` drafts with it, and the replies are mlx-vlm's."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "qwen4_exp"
    layer = BLOCK_FP8.layer(save_qwen4_checkpoint(path, BLOCK_FP8))
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, layer.expected)
    assert_dequantized(engine.runner.draft.head, layer)
    prompts = PROMPTS[:2]
    target = load_model(path)
    assert greedy_ids(engine, prompts, 12) == mlx_vlm_greedy_ids(target, prompts, 12)
    assert engine.stats().speculation.drafted > 0
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [64, 64]  # a layout not read: refused
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="in blocks of \\[64, 64\\]: only e4m3 in 128 x 128"):
        load_mtp_head(path, target, "qwen4_exp")
