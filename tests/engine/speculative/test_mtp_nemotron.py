"""MTP for Nemotron-H: its MTP module is an attention block then a MoE block of the target's own
class (the config's ``mtp_hybrid_override_pattern``), under ``mtp.layers.N.`` with ``enorm``,
``hnorm`` and ``eh_proj`` on its first block and ``final_layernorm`` on its last (mlx-vlm's
``nemotron_h_mtp`` drafter reads the same names); only the attention block has pages, in the
request's own blocks. The target is a hybrid (Mamba-2 layers beside attention and MoE ones), so a
rejected draft resumes its recurrent state. Oracles: mlx-lm's greedy generation of the target
(the output never changes), the MTP module run unpaged through mlx-lm's own KV cache over
mlx-lm's hidden states (the drafts themselves), the config's sizes (the pages), and the weights
the test wrote (loading); mlx-vlm's own drafter with the same weights (the module)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.stores.pages import LayerShape
from macbatch.models.check import check_model
from tests.support.mtp import (
    MTP_SETTINGS,
    MTP_TOKENS,
    NEMOTRON_H,
    NEMOTRON_PATTERN,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mtp_engine,
    mtp_target,
    nemotron_checkpoint_weights,
    predicting_mtp_head,
    quantize_for_mtp,
    random_mtp_head,
    recorded_proposals,
    save_nemotron_checkpoint,
    unpaged_drafts,
)
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import HYBRID_CONFIGS


@pytest.mark.parametrize("bits", [None, 4])
def test_greedy_outputs_are_mlx_lms_with_a_prefix_cache_hit(bits, tiny_tokenizer):
    """Five requests of staggered lengths in flight, prompts chunked by a 16-token budget,
    drafts mostly accepted (float); then the same prompts again, their blocks from the prefix cache.
    The MTP module keeps one store layer: its attention block's K and V per KV head."""
    model = mtp_target("nemotron_h")
    head = predicting_mtp_head(model)
    assert [layer.block_type for layer in head.layers] == ["*", "E"]
    if bits:
        quantize_for_mtp(model, head, bits)
    engine = mtp_engine(model, tiny_tokenizer, head)
    runner = engine.runner.draft
    args = model.args
    assert runner is not None
    assert runner.store.shapes == [LayerShape(args.num_key_value_heads, args.head_dim)]
    expected = [mlx_lm_greedy(model, p, MTP_TOKENS) for p in PROMPTS]
    assert greedy_ids(engine) == expected
    spec = engine.stats().speculation
    # 4-bit rounding moves the tiny target's choices off what the layer predicts more often
    assert spec.drafted > 0 and spec.accepted > (spec.drafted / 2 if bits is None else 0)
    assert greedy_ids(engine) == expected
    assert engine.stats().prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


def test_a_mixed_batch_preempted_still_replies_as_mlx_lm(tiny_tokenizer):
    """Requests that opt out beside ones that speculate, in 12 blocks of 8: some are preempted
    and recomputed from their prompt (their MTP pages rewritten by the next catch-up, their
    Mamba states from the prompt), prompts that repeat hit the prefix cache."""
    model = mtp_target("nemotron_h")
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == [mlx_lm_greedy(model, p, MTP_TOKENS) for p in prompts]
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.preemptions > 0
    assert_pool_idle(engine)


def test_drafts_are_the_mtp_modules_own(tiny_tokenizer, eager_speculation):
    """Every proposal equals the MTP module run unpaged (mlx-lm's KV cache for its attention
    block, none for its MoE block) over mlx-lm's hidden states of the request's tokens, then
    fed its own output and drafts; the replies stay mlx-lm's though they are mostly rejected.
    (Eager: the random module's failures must not stop a later request's prompt pass, which the
    unpaged module attends to.)"""
    model = mtp_target("nemotron_h")
    head = random_mtp_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == [mlx_lm_greedy(model, p, MTP_TOKENS) for p in PROMPTS]
    assert len(proposals) > 10
    for tokens, drafts in proposals:
        assert drafts == unpaged_drafts(model, head, tokens, len(drafts))


def _load(path: Path, speculative: str) -> Engine:
    return Engine.load(str(path), EngineConfig(speculative=speculative, **MTP_SETTINGS))


@pytest.mark.parametrize("bits", [None, 4])
def test_a_checkpoint_with_its_mtp_module_loads_and_drafts(bits, tmp_path):
    """Float: the module in Hugging Face's layout (experts unstacked); 4-bit: mlx-lm's conversion
    of the target with the module quantized beside it. ``auto`` drafts with it, with exactly the
    weights written, and the replies are mlx-lm's of the same checkpoint (its ``sanitize`` drops
    ``mtp.*``)."""
    path = tmp_path / "nemotron_h"
    expected = save_nemotron_checkpoint(path, bits)
    engine = _load(path, "auto")
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    model = mlx_lm.load(str(path))[0]
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == [mlx_lm_greedy(model, p, 12) for p in prompts]
    assert engine.stats().speculation.drafted > 0


def test_doctor_counts_the_module_and_a_bad_pattern_is_refused(tmp_path):
    """The doctor counts the MTP module as one layer; a pattern with a Mamba block (whose state
    the module would have to keep) is refused with why, ``auto`` then loading without it."""
    path = tmp_path / "heads"
    save_nemotron_checkpoint(path, None)
    rows = dict(check_model(str(path)).rows)
    assert rows["MTP heads"].startswith("1 MTP layer(s): --speculative auto drafts")
    config = json.loads((path / "config.json").read_text())
    config["mtp_hybrid_override_pattern"] = "M*"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="MTP block pattern 'M\\*'"):
        _load(path, "mtp")
    assert _load(path, "auto").runner.draft is None


def test_the_module_is_mlx_vlms_drafters():
    """The MTP module with random weights computes, at the last of 20 positions, what mlx-vlm's own
    ``NemotronHMTPDraftModel`` computes with the checkpoint's weights (``mtp.`` stripped, its
    ``sanitize`` stacking the experts) from the same config."""
    from mlx_lm.models.cache import KVCache
    from mlx_vlm.speculative.drafters.nemotron_h_mtp import ModelConfig, NemotronHMTPDraftModel

    model = mtp_target("nemotron_h")
    head = random_mtp_head(model)
    config = dict(HYBRID_CONFIGS["nemotron_h"], **NEMOTRON_H, num_nextn_predict_layers=1)
    config["mtp_hybrid_override_pattern"] = "".join(NEMOTRON_PATTERN)
    theirs = NemotronHMTPDraftModel(ModelConfig.from_dict({"text_config": config}))
    written = nemotron_checkpoint_weights(head, hugging_face=True)
    theirs.load_weights(list(theirs.sanitize(written).items()), strict=True)
    tokens = mx.array([[(11 * i) % 300 + 3 for i in range(20)]])
    inner = model.backbone
    embedded, hidden = inner.embeddings(tokens), inner(tokens)
    ours = head(embedded, hidden, [KVCache() if pages else None for pages in head.paged])
    want, _ = theirs._forward_hidden(embedded, hidden, tokens, theirs.make_cache())
    # unmasked here (as in the step, whose attention masks itself): the last row sees all
    assert mx.allclose(ours[:, -1], want[:, -1], atol=1e-4)
