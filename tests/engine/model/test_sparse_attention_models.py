"""DeepSeek Sparse Attention models (DeepSeek V3.2 ``deepseek_v32``, GLM-5 ``glm_moe_dsa``)
through the packed, paged engine: the lightning indexer's keys in the latent pages' blocks, each
row's top-k positions selected in the step, and the latent attention reading only those. Greedy
tokens (and log-probabilities) equal mlx-lm's own generation on tiny random models whose top-12
selection drops positions, with requests joining a running batch, chunked prefill, preemption,
prefix-cache hits, quantized pages and a restart from the disk tier; every selection the tests
make is checked untied first (``tests/support/sparse_attention.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.indexer_keys import IndexerKeysGroup, IndexerKeysSpec
from macbatch.engine.model.families import unsupported_reason
from tests.support.oracle import assert_matches_mlx_lm, assert_pool_idle, mlx_lm_greedy_logprobs
from tests.support.sparse_attention import (
    assert_selection_untied,
    assert_sparse_greedy,
    dense_copy,
    selection_changes,
)
from tests.support.staggered import (
    GREEDY,
    STAGGERED,
    assert_loading_matches_mlx_lm,
    assert_preemption_recomputes_identically,
    assert_restart_reads_the_prefix_from_disk,
    random_prompts,
    run_staggered,
    run_staggered_outputs,
)
from tests.support.tiny import SPARSE_MLA_CONFIGS, build_model

SPARSE = list(SPARSE_MLA_CONFIGS)


@pytest.mark.parametrize("arch", SPARSE)
def test_served(arch):
    assert unsupported_reason(arch) is None


@pytest.mark.parametrize("arch", SPARSE)
def test_staggered_batch_with_chunked_prefill(arch, tiny_tokenizer):
    """Nine requests join at different steps; a 24-token budget cuts the longer prompts into
    chunks that share steps with other requests' decodes; contexts up to 70 tokens select 12."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(**STAGGERED))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    # seed 0 leaves one top-k boundary tied under mlx 0.32.4 (relative gap 9.7e-6)
    prompts = random_prompts([1, 5, 37, 12, 3, 60, 8, 25, 2], seed=1)
    results = run_staggered(engine, prompts, GREEDY)
    for i, prompt in enumerate(prompts):
        assert_sparse_greedy(model, prompt, results[i])
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", SPARSE)
def test_attention_reads_the_selected_rows_only(arch, tiny_tokenizer):
    """Log-probabilities are mlx-lm's sparse ones, and far from those of the same weights
    attending to every position: an attention that read every token, or other tokens than the
    indexer's, fails here. A context within the top-k is attended whole, as mlx-lm does."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, block_size=8))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    long, short = random_prompts([40, 3], seed=4)
    outs = engine.generate([long, short], params)
    assert_selection_untied(model, long + outs[0].token_ids[:-1])
    for prompt, out in zip([long, short], outs):
        assert_matches_mlx_lm(model, prompt, out)
    dense = mlx_lm_greedy_logprobs(dense_copy(model), long, 1)[0]
    assert abs(dense[1] - outs[0].logprobs[0]) > 1e-3  # the first token's: the same context
    assert_pool_idle(engine)


def test_preemption_recomputes_identically(tiny_tokenizer):
    """A pool too small for five requests preempts some: their latent rows and indexer keys are
    recomputed, and every request keeps mlx-lm's tokens."""
    assert_preemption_recomputes_identically(build_model("glm_moe_dsa"), tiny_tokenizer)


def test_a_conversation_resumes_from_the_prefix_cache(tiny_tokenizer):
    """Each turn's prompt is the last turn's and its reply plus new tokens: from turn 2 on the
    earlier turns' latent rows and indexer keys come from the prefix cache."""
    model = build_model("deepseek_v32")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=128, block_size=8))
    prompt: list[int] = []
    cached = []
    for new in random_prompts([30, 9, 17, 4], seed=7):
        prompt = prompt + new
        [out] = engine.generate([prompt], GREEDY)
        assert_sparse_greedy(model, prompt, out.token_ids)
        cached.append(out.metrics.cached_tokens)
        prompt = prompt + out.token_ids
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:]), cached
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_pages_are_mlx_lms_caches_rounded(bits, tiny_tokenizer):
    """8- and 4-bit pages: mlx-lm's own latent and indexer-key caches, each row rounded through
    the page format, give the same tokens."""
    from tests.support.oracle import mlx_lm_greedy

    model = build_model("deepseek_v32")
    config = EngineConfig(
        num_blocks=64, block_size=8, max_num_batched_tokens=16, kv_bits=bits, kv_group_size=32
    )
    engine = Engine(model, tiny_tokenizer, config)
    prompts = random_prompts([21, 6, 40], seed=5)
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY)):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens, bits, 32)
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [None, 8])
def test_a_restart_reads_the_indexer_keys_from_disk(bits, tiny_tokenizer, tmp_path):
    """The disk tier keeps a block's latent rows and indexer keys together: a fresh engine
    reads a 64-token prefix back and its tokens stay mlx-lm's (a lost or stale key changes the
    selection)."""
    model = build_model("glm_moe_dsa")
    assert_restart_reads_the_prefix_from_disk(model, tiny_tokenizer, tmp_path, bits)


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
@pytest.mark.parametrize("arch", SPARSE)
def test_loaded_from_the_hugging_face_layout(arch, quantized, tmp_path: Path):
    """``Engine.load`` of a saved checkpoint (config fields and weight names as published) and
    of mlx-lm's 4-bit conversion of it."""
    assert_loading_matches_mlx_lm(tmp_path, arch, quantized, group_size=32)


@pytest.mark.parametrize("arch", SPARSE)
def test_kv_bytes_per_token_are_the_latent_and_the_indexer_keys(arch, tiny_tokenizer):
    """One latent row (``kv_lora_rank + qk_rope_head_dim``) and one indexer key
    (``index_head_dim``) per token per layer, float32 here, as config.json sizes them."""
    config = SPARSE_MLA_CONFIGS[arch]
    engine = Engine(build_model(arch), tiny_tokenizer, EngineConfig(num_blocks=16, block_size=8))
    layers = config["num_hidden_layers"]
    latent = layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4
    keys = layers * config["index_head_dim"] * 4
    assert engine.info.model.kv_bytes_per_token == latent + keys
    spec = engine.kv.full.spec
    assert isinstance(spec, IndexerKeysSpec)
    assert spec.index_bytes_per_block == keys * 8
    assert spec.bytes_per_block == (latent + keys) * 8


@pytest.mark.usefixtures("eager_speculation")
def test_prompt_lookup_drafts_keep_mlx_lms_tokens(tiny_tokenizer):
    """Verified drafts are chunk rows of their own: each selects over the keys before it,
    rejected drafts' latent rows and indexer keys are given back."""
    model = build_model("deepseek_v32")
    config = EngineConfig(
        num_blocks=64,
        block_size=8,
        max_num_batched_tokens=16,
        speculative="ngram",
        num_speculative_tokens=4,
    )
    engine = Engine(model, tiny_tokenizer, config)
    prompts = [[40, 41, 42, 43, 44, 45] * 4, random_prompts([7], seed=2)[0] * 3]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for prompt, out in zip(prompts, engine.generate(prompts, params)):
        assert_sparse_greedy(model, prompt, out.token_ids)
    assert engine.stats().speculation.verifications > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [None, 8])
@pytest.mark.parametrize("arch", SPARSE)
def test_fp8_indexer_keys_select_as_mlx_lms_indexer_over_rounded_keys(arch, bits, tiny_tokenizer):
    """``indexer_keys="fp8"``: nine staggered requests' tokens and log-probabilities are
    mlx-lm's with its indexer's keys rounded through the fp8 format (its latent through the 8-bit
    format too with ``kv_bits=8``), on a sequence whose selections the rounding changes, so an
    engine that kept the keys unrounded (or rounded them otherwise) fails. GLM-5's indexer ropes
    its keys interleaved: they are rounded after that rope, as they are paged."""
    model = build_model(arch)
    engine = Engine(
        model, tiny_tokenizer, EngineConfig(**STAGGERED, kv_bits=bits, indexer_keys="fp8")
    )
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    prompts = random_prompts([1, 5, 37, 12, 3, 60, 8, 25, 2], seed=2)  # seed 1: a tie
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)
    results = run_staggered_outputs(engine, prompts, params, join_every=1)
    for i, prompt in enumerate(prompts):
        out = results[i]
        if len(prompt) + len(out.token_ids) - 1 > model.args.index_topk:
            assert_selection_untied(model, prompt + out.token_ids[:-1], fp8_keys=True)
        want = mlx_lm_greedy_logprobs(model, prompt, len(out.token_ids), bits, 32, "fp8")
        assert out.token_ids == [token for token, _ in want]
        abs_tol = 1e-4 if bits is None else 1e-3
        assert out.logprobs == pytest.approx([lp for _, lp in want], abs=abs_tol)
    longest = prompts[5] + results[5].token_ids[:-1]
    assert selection_changes(model, longest), "fp8 keys select as float keys: nothing tested"
    assert_pool_idle(engine)


def test_fp8_indexer_keys_restart_from_their_own_disk_namespace(tiny_tokenizer, tmp_path):
    """A restart reads fp8 key pages back from the disk tier (tokens stay mlx-lm's over rounded
    keys), and an engine with float keys finds none of them: the namespace names the format."""
    model = build_model("deepseek_v32")
    assert_restart_reads_the_prefix_from_disk(
        model, tiny_tokenizer, tmp_path, None, indexer_keys="fp8"
    )
    engine = Engine(
        model,
        tiny_tokenizer,
        EngineConfig(num_blocks=64, block_size=8, disk_cache_dir=str(tmp_path)),
    )
    [out] = engine.generate([random_prompts([70], seed=1)[0] + [5, 6, 7]], GREEDY)
    assert out.metrics.disk_cached_tokens == 0
    engine.close()


def test_fp8_preemption_recomputes_identically(tiny_tokenizer):
    """Preempted requests recompute their fp8 keys: every request keeps mlx-lm's tokens over
    rounded keys."""
    from tests.support.oracle import mlx_lm_greedy

    model = build_model("deepseek_v32")
    config = EngineConfig(
        num_blocks=12, block_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
        indexer_keys="fp8",
    )  # fmt: skip
    engine = Engine(model, tiny_tokenizer, config)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = random_prompts([20, 18, 22, 15, 19], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, 24, indexer_keys="fp8")
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [None, 8])
def test_fp8_indexer_keys_count_their_bytes(bits, tiny_tokenizer):
    """An fp8 key is a byte per column and a float32 scale per 128 (one, for the tiny model's
    64 columns), whatever the latent's format (groups of 32, whose 8-bit keys would be 72)."""
    config = SPARSE_MLA_CONFIGS["deepseek_v32"]
    group = None if bits is None else 32
    settings = EngineConfig(
        num_blocks=16, block_size=8, kv_bits=bits, kv_group_size=group, indexer_keys="fp8"
    )
    engine = Engine(build_model("deepseek_v32"), tiny_tokenizer, settings)
    layers = config["num_hidden_layers"]
    width = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    latent = layers * (width * 4 if bits is None else width + width // 32 * 4)
    keys = layers * (config["index_head_dim"] + 4)
    assert engine.info.model.kv_bytes_per_token == latent + keys
    assert engine.kv.full.spec.index_bytes_per_block == keys * 8


def test_fp8_indexer_keys_need_an_indexer(tiny_tokenizer):
    with pytest.raises(ValueError, match="has no lightning indexer"):
        Engine(
            build_model("deepseek_v3"),
            tiny_tokenizer,
            EngineConfig(num_blocks=16, indexer_keys="fp8"),
        )
