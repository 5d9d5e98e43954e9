"""MTP for the families that store their MTP layer as decoder layer ``num_hidden_layers``
(DeepSeek V3 and GLM-4.7-Flash, whose layer attends with MLA over latent pages; DeepSeek V3.2
and GLM-5, whose MLA layer selects its top-k positions with a lightning indexer over its own
indexer-key pages; and GLM-4.5, whose layer is GQA). Oracles: mlx-lm's greedy generation of
the target (the output never changes), the MTP layer run unpaged through mlx-lm's own cache
path over mlx-lm's hidden states (the drafts themselves), the config's latent sizes (the pages),
and the weights the test wrote (loading)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.nn as nn
import mlx_lm
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.stores.pages import LayerShape
from macbatch.models.check import check_model
from tests.support.mtp import (
    MTP_SETTINGS,
    MTP_TOKENS,
    NEXTN_ARCHS,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mtp_engine,
    mtp_target,
    predicting_mtp_head,
    quantize_for_mtp,
    random_mtp_head,
    recorded_proposals,
    save_nextn_checkpoint,
    unpaged_drafts,
    without_nextn_layer,
)
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy

# the sparse families (deepseek_v32, glm_moe_dsa) differ only in their layers' lightning
# indexer, so each test runs the one case of them that shows it (the tests stay cheap)
SPARSE = ("deepseek_v32", "glm_moe_dsa")
ARCHS = sorted(set(NEXTN_ARCHS) - set(SPARSE))


def _expected_shapes(model: nn.Module) -> list[LayerShape]:
    """The MTP layer's pages from the config alone: MLA's latent row (and a sparse layer's
    indexer key row beside it), else K and V per head."""
    args = model.args
    rank = getattr(args, "kv_lora_rank", None)
    if rank is None:
        return [LayerShape(args.num_key_value_heads, args.head_dim)]
    latent = LayerShape(1, rank + args.qk_rope_head_dim, value_dim=rank)
    index = getattr(args, "index_head_dim", None)
    return [latent] if index is None else [latent, LayerShape(1, index, value_dim=0)]


@pytest.mark.parametrize(
    ("arch", "bits"), [(a, b) for a in ARCHS for b in (None, 4)] + [("deepseek_v32", None)]
)
def test_greedy_outputs_are_mlx_lms_with_a_prefix_cache_hit(arch, bits, tiny_tokenizer):
    """Five requests in flight, prompts chunked by a 16-token budget, drafts mostly accepted;
    then the same prompts again, their blocks from the prefix cache."""
    model = mtp_target(arch)
    head = predicting_mtp_head(model)
    # built as the checkpoint's layer num_hidden_layers: a sparse-MoE layer, as the target's last
    assert type(head.layers[0].mlp) is type(model.layers[-1].mlp) is not type(model.layers[0].mlp)
    if bits:
        quantize_for_mtp(model, head, bits)
    engine = mtp_engine(model, tiny_tokenizer, head)
    runner = engine.runner.draft
    assert runner is not None and runner.store.shapes == _expected_shapes(model)
    expected = [mlx_lm_greedy(model, p, MTP_TOKENS) for p in PROMPTS]
    assert greedy_ids(engine) == expected
    spec = engine.stats().speculation
    assert spec.drafted > 0 and spec.accepted > spec.drafted / 2
    assert greedy_ids(engine) == expected
    assert engine.stats().prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ARCHS)
def test_preempted_requests_still_reply_as_mlx_lm(arch, tiny_tokenizer):
    """10 blocks of 8 for five requests: some are preempted and recomputed from their prompt,
    their MTP pages (latent for MLA) rewritten by the next catch-up; outputs unchanged."""
    model = mtp_target(arch)
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=10)
    assert greedy_ids(engine) == [mlx_lm_greedy(model, p, MTP_TOKENS) for p in PROMPTS]
    stats = engine.stats()
    assert stats.preemptions > 0 and stats.speculation.accepted > 0
    assert_pool_idle(engine)


def test_a_sparse_targets_mixed_batch_preempted_and_from_the_prefix_cache(tiny_tokenizer):
    """GLM-5's layout: requests that opt out beside ones that speculate, a pool small enough to
    preempt, and prompts that repeat (prefix-cache hits: their latent and indexer-key rows, the
    MTP layer's rewritten by its catch-up); prompts past ``index_topk`` (12), so the MTP layer
    selects positions. Every reply is mlx-lm's."""
    model = mtp_target("glm_moe_dsa")
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == [mlx_lm_greedy(model, p, MTP_TOKENS) for p in prompts]
    stats = engine.stats()
    assert stats.speculation.accepted > 0
    assert stats.preemptions > 0 and stats.prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", [*ARCHS, "glm_moe_dsa"])
def test_drafts_are_the_mtp_layers_own(arch, tiny_tokenizer, eager_speculation):
    """Every proposal equals the MTP layer run unpaged (mlx-lm's KV cache and its own attention
    path: an MLA layer's expanded keys, not the absorbed latent pages) over mlx-lm's hidden
    states of the request's tokens, then fed its own output and drafts. (Eager: the random
    layer's failures must not stop a later request's prompt pass, which the unpaged layer
    attends to.)"""
    model = mtp_target(arch)
    head = random_mtp_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == [mlx_lm_greedy(model, p, MTP_TOKENS) for p in PROMPTS]
    assert len(proposals) > 10
    for tokens, drafts in proposals:
        assert drafts == unpaged_drafts(model, head, tokens, len(drafts))


def _load(path: Path, speculative: str) -> Engine:
    return Engine.load(str(path), EngineConfig(speculative=speculative, **MTP_SETTINGS))


@pytest.mark.parametrize(
    ("arch", "bits"), [(a, b) for a in ARCHS for b in (None, 4)] + [("glm_moe_dsa", None)]
)
def test_a_checkpoint_with_its_mtp_layer_loads_and_drafts(arch, bits, tmp_path):
    """Float: the MTP layer in Hugging Face's layout (experts unstacked, DeepSeek's
    ``kv_b_proj`` whole, ``embed_tokens`` and ``shared_head.head`` copies of the target's);
    4-bit: mlx-lm's conversion of the target with the MTP layer quantized beside it. Both under
    ``model.layers.{num_hidden_layers}``; ``auto`` drafts with it, with exactly the weights
    written, and the replies are mlx-lm's of the checkpoint without that layer."""
    path = tmp_path / arch
    expected = save_nextn_checkpoint(path, arch, bits)
    engine = _load(path, "auto")
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    model = mlx_lm.load(str(without_nextn_layer(path)))[0]
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == [mlx_lm_greedy(model, p, 12) for p in prompts]
    assert engine.stats().speculation.drafted > 0


def test_doctor_counts_the_mtp_layer(tmp_path):
    save_nextn_checkpoint(tmp_path / "heads", "glm4_moe_lite", None)
    rows = dict(check_model(str(tmp_path / "heads")).rows)
    assert rows["MTP heads"].startswith("1 MTP layer(s): --speculative auto drafts")
    dropped = without_nextn_layer(tmp_path / "heads")
    config = json.loads((dropped / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1  # declared, as mlx-lm's convert leaves it
    assert "weights were dropped" in dict(check_model(str(dropped)).rows)["MTP heads"]
    with pytest.raises(ValueError, match="has no MTP weights"):
        _load(dropped, "mtp")


@pytest.mark.parametrize("bits", [None, 4])
def test_a_restart_from_disk_and_quantized_latent_pages(bits, tiny_tokenizer, tmp_path):
    """An MLA target and its MLA MTP layer over quantized (4-bit) or float latent pages, the
    disk tier keeping the target's blocks: a fresh engine reads the prompt's blocks back (the
    MTP layer's rows of them are written again by its catch-up), drafts, and its tokens stay
    mlx-lm's over a cache rounded as the pages round it."""
    model = mtp_target("deepseek_v3")
    head = predicting_mtp_head(model)
    config = dict(disk_cache_dir=str(tmp_path), kv_bits=bits)
    prompt = [(7 * i) % 300 + 5 for i in range(40)]
    first = mtp_engine(model, tiny_tokenizer, head, **config)
    greedy_ids(first, [prompt])
    first.close()
    engine = mtp_engine(model, tiny_tokenizer, head, **config)
    params = SamplingParams(max_tokens=MTP_TOKENS, temperature=0, ignore_eos=True)
    [out] = engine.generate([prompt + [5, 6, 7]], params)
    assert out.metrics.disk_cached_tokens == 40
    expected = mlx_lm_greedy(model, prompt + [5, 6, 7], MTP_TOKENS, bits, kv_group_size=32)
    assert out.token_ids == expected
    assert engine.stats().speculation.accepted > 0
    engine.close()


def test_fp8_indexer_keys_page_the_mtp_layers_too(tiny_tokenizer):
    """``indexer_keys="fp8"``: the MTP layer's own indexer keys are fp8 pages as the target's
    are, and the verified tokens are mlx-lm's over its indexer keys rounded through the format."""
    from macbatch.engine.stores.fp8_keys import Fp8Pages

    model = mtp_target("deepseek_v32")
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), indexer_keys="fp8")
    runner = engine.runner.draft
    assert runner is not None and isinstance(runner.store.key_pages(1), Fp8Pages)
    expected = [mlx_lm_greedy(model, p, MTP_TOKENS, indexer_keys="fp8") for p in PROMPTS]
    assert greedy_ids(engine) == expected
    assert engine.stats().speculation.accepted > 0
    assert_pool_idle(engine)
