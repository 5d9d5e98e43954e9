"""Multi-head latent attention (MLA) models through the packed, paged engine with latent pages:
greedy tokens equal mlx-lm's own generation (its own cache, its own MLA code) for every MLA
family, float and 4-bit weights, with requests joining a running batch, chunked prefill, a pool
small enough to preempt, prefix-cache hits and the disk tier, 8- and 4-bit latent pages,
speculative decoding and structured output; the pool holds one latent row per token per layer."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import mlx.core as mx
import mlx.nn as nn
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams, StructuredOutput
from macbatch.engine.kv.latent import LatentGroup
from macbatch.engine.model.families import unsupported_reason
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.refusals import assert_refused_at_load
from tests.support.staggered import (
    GREEDY,
    STAGGERED,
    assert_loading_matches_mlx_lm,
    assert_preemption_recomputes_identically,
    assert_restart_reads_the_prefix_from_disk,
    assert_staggered_batch_matches_mlx_lm,
    random_prompts,
)
from tests.support.structured import QWEN3_VOCAB, real_tokenizer, schema_family
from tests.support.tiny import MLA_CONFIGS, REFUSED_MLA_CONFIGS, SPARSE_MLA_CONFIGS, build_model

# the families whose mlx-lm code caches the latent itself (the others expand keys per head, so
# no cache of theirs holds what latent pages hold)
LATENT_IN_MLX_LM = ["deepseek_v3", "glm4_moe_lite", "mistral4"]


def _quantized(arch: str) -> nn.Module:
    """``arch``'s tiny model with 4-bit weights wherever a layer's input width allows groups of
    32 (every projection, the absorbed ``embed_q`` / ``unembed_out`` or ``kv_b_proj`` too) and
    the model does not keep the layer unquantized (Kimi K3's residual projections)."""
    model = build_model(arch)
    keeps = getattr(model, "quant_predicate", lambda *_: True)
    nn.quantize(
        model,
        group_size=32,
        bits=4,
        class_predicate=lambda path, m: (
            hasattr(m, "to_quantized")
            and m.weight.shape[-1] % 32 == 0
            and keeps(path, m) is not False
        ),
    )
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
@pytest.mark.parametrize("arch", list(MLA_CONFIGS))
def test_staggered_batch_with_chunked_prefill(arch, quantized, tiny_tokenizer):
    """Nine requests join at different steps; a 24-token budget chunks the longer prompts, and
    every layer's cache is one latent row per token in the latent group's pages."""
    model = _quantized(arch) if quantized else build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(**STAGGERED))
    assert isinstance(engine.kv.full, LatentGroup)
    assert engine.runner.store.values == []  # no value pages: the latent is stored once
    assert_staggered_batch_matches_mlx_lm(engine, model)


@pytest.mark.parametrize("arch", ["glm4_moe_lite", "deepseek_v2"])
def test_preemption_recomputes_identically(arch, tiny_tokenizer):
    assert_preemption_recomputes_identically(build_model(arch), tiny_tokenizer)


def test_a_conversation_resumes_from_the_prefix_cache(tiny_tokenizer):
    """Each turn's prompt is the last turn's prompt and reply plus new tokens: from turn 2 on,
    the earlier turns' latent rows are read from the prefix cache."""
    model = build_model("glm4_moe_lite")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=128, block_size=8))
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompt: list[int] = []
    cached = []
    for turn, new in enumerate(random_prompts([30, 9, 17, 4], seed=7)):
        prompt = prompt + new
        [out] = engine.generate([prompt], params)
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens), f"turn {turn}"
        cached.append(out.metrics.cached_tokens)
        prompt = prompt + out.token_ids
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:]), cached
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("arch", LATENT_IN_MLX_LM)
def test_quantized_latent_pages_are_mlx_lms_cache_rounded(arch, bits, tiny_tokenizer):
    """8- and 4-bit latent pages: mlx-lm's own latent cache, each row rounded through the page
    format (its latent and its RoPE key apart: the groups of 32 end where the latent ends), gives
    the same tokens, so the pages hold exactly the rounded rows and nothing else differs."""
    model = build_model(arch)
    config = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16, kv_bits=bits)
    engine = Engine(model, tiny_tokenizer, config)
    prompts = random_prompts([21, 6, 40], seed=5)
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        expected = mlx_lm_greedy(model, prompt, GREEDY.max_tokens, bits, kv_group_size=32)
        assert out.token_ids == expected
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits", [None, 4])
def test_a_restart_reads_the_latent_rows_from_disk(bits, tiny_tokenizer, tmp_path):
    """The disk tier keeps an MLA model's prompt blocks (the latent pages are the full group's
    blocks): a fresh engine reads them back and its tokens stay mlx-lm's."""
    assert_restart_reads_the_prefix_from_disk(
        build_model("deepseek_v3"), tiny_tokenizer, tmp_path, bits
    )


@pytest.mark.usefixtures("eager_speculation")
@pytest.mark.parametrize("speculative", ["ngram", "draft"])
@pytest.mark.parametrize("arch", ["glm4_moe_lite", "deepseek_v2"])
def test_speculative_decoding_keeps_mlx_lms_tokens(arch, speculative, tiny_tokenizer):
    """Prompt lookup, and the model drafting for itself (a draft model's latent pages share the
    target's block ids): verified drafts write latent rows that rejected drafts give back."""
    model = build_model(arch)
    config = EngineConfig(
        num_blocks=64,
        block_size=8,
        max_num_batched_tokens=16,
        speculative=speculative,
        num_speculative_tokens=4,
    )
    draft = model if speculative == "draft" else None
    engine = Engine(model, tiny_tokenizer, config, draft_model=draft)
    prompts = [[40, 41, 42, 43, 44, 45] * 4, [90 + (i % 5) for i in range(23)], [200, 17, 33]]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens)
    assert engine.stats().speculation.verifications > 0
    assert_pool_idle(engine)


def test_structured_output_on_an_mla_model():
    """JSON schemas constrain an MLA model's replies (``jsonschema`` validates them) in the same
    steps as an unconstrained request (mlx-lm's tokens)."""
    model = build_model("glm4_moe_lite", vocab_size=QWEN3_VOCAB)
    engine = Engine(model, real_tokenizer("qwen3"), EngineConfig(num_blocks=128, block_size=8))
    schemas = schema_family(4)
    prompts = [[9906, 11, 1246, 400 + i] for i in range(4)] + [[600, 601, 602]]
    params = [
        SamplingParams(max_tokens=96, temperature=0, structured=StructuredOutput(json_schema=s))
        for s in schemas
    ] + [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)]
    outs = engine.generate(prompts, params)
    for out, schema in zip(outs, schemas):
        jsonschema.validate(json.loads(out.text), schema)
    assert outs[-1].token_ids == mlx_lm_greedy(model, prompts[-1], 12)
    assert_pool_idle(engine)


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
@pytest.mark.parametrize("arch", ["glm4_moe_lite", "deepseek_v3", "minicpm3"])
def test_loaded_from_the_hugging_face_layout(arch, quantized, tmp_path: Path):
    """``Engine.load`` of a saved checkpoint and of its 4-bit conversion (GLM-4.7-Flash's type
    once failed here, on the attention mask)."""
    assert_loading_matches_mlx_lm(tmp_path, arch, quantized, group_size=32)


def test_every_mla_family_of_the_installed_mlx_lm_is_served_or_refused():
    """Each mlx-lm model module with a compressed latent (``kv_lora_rank``) is served (a tiny
    model of it runs every test above, or test_sparse_attention_models.py's) or refused at load
    with a reason: a new one in a later mlx-lm fails here until it is decided."""
    import mlx_lm.models

    folder = Path(mlx_lm.models.__file__).parent
    mla = {path.stem for path in folder.glob("*.py") if "kv_lora_rank" in path.read_text()}
    refused = {name for name in mla if unsupported_reason(name)}
    served = set(MLA_CONFIGS) | set(SPARSE_MLA_CONFIGS)  # sparse: test_sparse_attention_models
    assert not refused & served
    assert mla - refused - served == set()
    assert set(REFUSED_MLA_CONFIGS) <= refused


@pytest.mark.parametrize("arch", list(REFUSED_MLA_CONFIGS))
def test_a_refused_mla_family_is_refused_at_load_with_its_reason(arch, tiny_tokenizer):
    """Refused before its forward runs (it would fail inside mlx-lm's code, unexplained)."""
    assert_refused_at_load(arch, tiny_tokenizer)
