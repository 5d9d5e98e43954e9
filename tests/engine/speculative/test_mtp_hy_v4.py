"""MTP for Hunyuan V4 (mlx-vlm's ``hy_v4``): its MTP layer, under ``model.mtp_layers.0.``
(``enorm``, ``hnorm``, ``eh_proj``, ``final_layernorm`` beside the layer's own weights), is the
layer mlx-vlm's ``hy_v4_mtp`` drafter builds: DeepSeek V3.2's sparse MLA with Hunyuan's sinks and
output gate, its own lightning indexer, a MoE MLP, and one residual stream where the target's
layers keep four (hyper-connections). Its latent rows and indexer keys are paged in the request's
own blocks. Oracles: mlx-vlm's own greedy generation of the target (the output never changes;
its indexer's partition evaluated per call: tests/support/tiny_hy_v4.py), the MTP layer run
unpaged through mlx-lm's KV caches over mlx-vlm's hidden states (the drafts themselves), mlx-vlm's
own drafter's forward with the same weights, and the weights the test wrote (loading)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.stores.pages import LayerShape
from tests.support.mtp import (
    MTP_SETTINGS,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mlx_vlm_greedy_ids,
    mtp_engine,
    predicting_mtp_head,
    quantize_for_mtp,
    random_mtp_head,
    recorded_proposals,
    save_hy_v4_checkpoint,
    unpaged_drafts,
)
from tests.support.mtp_fp8 import MXFP8, assert_dequantized
from tests.support.oracle import assert_pool_idle
from tests.support.tiny_hy_v4 import CONFIG, hy_v4_model, partition_per_call

pytest.importorskip("mlx_vlm")


@pytest.fixture(scope="module", autouse=True)
def _partition_fixed():
    with partition_per_call():
        yield


@pytest.mark.parametrize("bits", [None, 4])
def test_greedy_outputs_are_mlx_vlms_with_a_prefix_cache_hit(bits, tiny_tokenizer):
    """Five requests of staggered lengths in flight (contexts past ``index_topk``: the MTP layer
    selects positions), prompts chunked by a 16-token budget, drafts mostly accepted; then the
    same prompts again from the prefix cache. Its pages: a latent row and an indexer-key row."""
    model = hy_v4_model()
    head = predicting_mtp_head(model)
    if bits:
        quantize_for_mtp(model, head, bits)
    expected = mlx_vlm_greedy_ids(model)
    engine = mtp_engine(model, tiny_tokenizer, head)
    rank, rope = CONFIG["kv_lora_rank"], CONFIG["qk_rope_head_dim"]
    assert engine.runner.draft.store.shapes == [
        LayerShape(1, rank + rope, value_dim=rank),
        LayerShape(1, CONFIG["index_head_dim"], value_dim=0),
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
    and recomputed (their MTP latent and indexer rows rewritten by the next catch-up)."""
    model = hy_v4_model()
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == mlx_vlm_greedy_ids(model, prompts)
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.preemptions > 0
    assert_pool_idle(engine)


def test_drafts_are_the_mtp_layers_own(tiny_tokenizer, eager_speculation):
    """Every proposal equals the MTP layer run unpaged (mlx-lm's KV caches for its latent and
    indexer keys, its own sparse attention path) over mlx-vlm's hidden states of the request's
    tokens, then fed its own output and drafts."""
    model = hy_v4_model()
    head = random_mtp_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == mlx_vlm_greedy_ids(model)
    assert len(proposals) > 10
    for tokens, drafts in proposals:
        assert drafts == unpaged_drafts(model, head, tokens, len(drafts))


def test_the_layer_is_mlx_vlms_drafters():
    """The MTP layer with random weights computes, at the last of 20 positions, what mlx-vlm's own
    ``HyV4MTPDraftModel`` computes with them (loaded under its names: the checkpoint's
    ``model.mtp_layers.0.`` ones with ``decoder.`` for the layer and ``norm`` for
    ``final_layernorm``, as its splitter renames them)."""
    from mlx_lm.models.cache import CacheList, KVCache
    from mlx_vlm.speculative.drafters.hy_v4_mtp import HyV4MTPDraftModel, ModelConfig

    model = hy_v4_model()
    head = random_mtp_head(model)
    text = model.language_model
    theirs = HyV4MTPDraftModel(ModelConfig(text_config=text.args))
    names = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm"}
    renamed = [
        (f"decoder.{rest[2:]}" if part == "layers" else f"{names.get(part, part)}.{rest}", value)
        for name, value in tree_flatten(head.parameters())
        for part, _, rest in [name.partition(".")]
    ]
    theirs.load_weights(renamed, strict=True)
    tokens = mx.array([[(11 * i) % 300 + 3 for i in range(20)]])
    embedded, hidden = text.model.embed_tokens(tokens), text.model(tokens)
    ours = head(embedded, hidden, [CacheList(KVCache(), KVCache())])
    want = theirs._forward_hidden(embedded, hidden, theirs.make_cache(), None)
    # unmasked here (as in the step, whose attention masks itself): the last row sees all
    assert mx.allclose(ours[:, -1], want[:, -1], atol=1e-4)


def test_a_checkpoint_with_its_mtp_layer_loads_and_drafts(tmp_path):
    """A checkpoint under Hugging Face's names with its MTP layer at ``model.mtp_layers.0.``:
    ``auto`` drafts with it, with exactly the weights written, and the replies are mlx-vlm's of
    the same checkpoint (its ``sanitize`` drops the MTP layer)."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "hy_v4"
    expected = save_hy_v4_checkpoint(path)
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == mlx_vlm_greedy_ids(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0


def test_a_mxfp8_checkpoints_mtp_layer_loads_as_the_format_defines(tmp_path):
    """Hunyuan V4's real checkpoints store the MTP layer in mxfp8 (e4m3 codes, a ``weight_scale``
    of power-of-two bytes per 32 inputs beside each projection, fused experts' beside them as
    ``gate_up_proj_scale``; config ``quantization_config`` ModelOpt's MXFP8), encoded here by the
    float64 numpy oracle of the format: the layer loads as MLX's mxfp8 layers holding exactly the
    oracle's codes and scales, each standing for the oracle's values (``eh_proj`` too, which the
    target's ``sanitize`` drops), ``auto`` drafts with it, and the replies are mlx-vlm's."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "hy_v4"
    layer = MXFP8.layer(save_hy_v4_checkpoint(path, MXFP8))
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, layer.expected)
    assert_dequantized(engine.runner.draft.head, layer)
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == mlx_vlm_greedy_ids(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0
