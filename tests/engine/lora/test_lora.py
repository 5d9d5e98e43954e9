"""Adapters per request: every request's greedy tokens equal mlx-lm's own generation with its
adapter loaded (``mlx_lm.tuner.utils.load_adapters``), in batches that mix adapters and the
base model, over float and 4-bit base weights, dense, MoE and MLA targets, with chunked prefill,
preemption and prefix hits."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine import Engine, EngineConfig, PromptInput, SamplingParams
from macbatch.engine.lora.files import AdapterError
from tests.support.lora import ATTENTION, MLP, adapted_model, base_model, save_adapter, to_peft
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts, run_staggered

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _adapters(root, arch: str = "qwen3") -> dict[str, object]:
    """Three adapters of different ranks and targets (None: the base model)."""
    return {
        "attn": save_adapter(root / "attn", arch, seed=1, keys=ATTENTION, rank=4),
        "mlp": save_adapter(root / "mlp", arch, seed=2, keys=MLP, rank=8, num_layers=1),
        "all": save_adapter(root / "all", arch, seed=3, rank=2, scale=4.0),
    }


def _engine(arch, tokenizer, adapters, quantized=False, **config) -> Engine:
    pairs = tuple((name, str(path)) for name, path in adapters.items())
    settings = dict(num_blocks=96, block_size=8, max_num_batched_tokens=24) | config
    return Engine(base_model(arch, quantized), tokenizer, EngineConfig(adapters=pairs, **settings))


def _oracle(arch, adapters, names, prompts, max_tokens, quantized=False) -> list[list[int]]:
    models = {n: adapted_model(arch, adapters.get(n), quantized) for n in set(names)}
    return [mlx_lm_greedy(models[n], p, max_tokens) for n, p in zip(names, prompts)]


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
def test_a_batch_mixing_three_adapters_and_the_base(tmp_path, tiny_tokenizer, quantized):
    """Twelve requests, three adapters and the base, join at different steps; the 24-token
    budget chunks the longer prompts."""
    adapters = _adapters(tmp_path)
    engine = _engine("qwen3", tiny_tokenizer, adapters, quantized)
    names = [None, "attn", "mlp", "all"] * 3
    prompts = random_prompts([5, 30, 9, 41, 3, 17, 26, 8, 12, 35, 6, 20])
    inputs = [PromptInput(p, adapter=n) for p, n in zip(prompts, names)]
    got = run_staggered(engine, inputs, GREEDY)
    want = _oracle("qwen3", adapters, names, prompts, GREEDY.max_tokens, quantized)
    assert [got[i] for i in range(len(prompts))] == want
    assert len({tuple(w) for w in want[:4]}) > 1  # the adapters change the tokens
    assert_pool_idle(engine)


def test_dora_adapter(tmp_path, tiny_tokenizer):
    adapters = {"dora": save_adapter(tmp_path / "dora", "llama", seed=4, keys=ATTENTION, dora=True)}
    engine = _engine("llama", tiny_tokenizer, adapters)
    names = ["dora", None]
    prompts = random_prompts([7, 19], seed=3)
    outs = engine.generate([PromptInput(p, adapter=n) for p, n in zip(prompts, names)], GREEDY)
    assert [o.token_ids for o in outs] == _oracle("llama", adapters, names, prompts, 8)


def test_preemption_recomputes_each_adapter(tmp_path, tiny_tokenizer):
    """A pool of 12 blocks for six prompts forces preemption; tokens are unchanged."""
    adapters = _adapters(tmp_path)
    engine = _engine("qwen3", tiny_tokenizer, adapters, num_blocks=12, max_num_batched_tokens=64)
    names = ["attn", None, "mlp", "all", "attn", "mlp"]
    prompts = random_prompts([20, 18, 22, 19, 21, 17], seed=5)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = engine.generate([PromptInput(p, adapter=n) for p, n in zip(prompts, names)], params)
    assert engine.stats().preemptions > 0
    assert [o.token_ids for o in outs] == _oracle("qwen3", adapters, names, prompts, 24)


def test_a_prefix_cached_under_one_adapter_is_never_served_to_another(tmp_path, tiny_tokenizer):
    """The same 40-token prompt under each adapter and the base: none reads another's blocks,
    and the same adapter's second request reads its own."""
    adapters = _adapters(tmp_path)
    engine = _engine("qwen3", tiny_tokenizer, adapters)
    prompt = random_prompts([40], seed=7)[0]
    names = [None, "attn", "mlp", "all"]
    for name, want in zip(names, _oracle("qwen3", adapters, names, [prompt] * 4, 8)):
        (first,) = engine.generate([PromptInput(prompt, adapter=name)], GREEDY)
        assert first.metrics.cached_tokens == 0 and first.token_ids == want
        (again,) = engine.generate([PromptInput(prompt, adapter=name)], GREEDY)
        assert again.metrics.cached_tokens > 0 and again.token_ids == want


def test_peft_adapter_equals_its_mlx_lm_twin(tmp_path, tiny_tokenizer):
    mlx_dir = save_adapter(tmp_path / "mlx", seed=6, keys=ATTENTION + MLP, rank=4)
    engine = _engine("qwen3", tiny_tokenizer, {"peft": to_peft(mlx_dir, tmp_path / "peft")})
    prompts = random_prompts([11, 28], seed=8)
    outs = engine.generate([PromptInput(p, adapter="peft") for p in prompts], GREEDY)
    want = _oracle("qwen3", {"peft": mlx_dir}, ["peft"] * 2, prompts, 8)
    assert [o.token_ids for o in outs] == want


EXPERTS = ["mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj"]


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
def test_an_moe_model_with_its_experts_and_attention_adapted(tmp_path, tiny_tokenizer, quantized):
    """gpt_oss: one adapter of its experts (mlx-lm's LoRASwitchLinear), one of its attention and
    router, and the base, in one batch; prompts of 40 tokens in a 64-token budget make steps of
    64 rows, whose (row, expert) pairs mlx-lm's SwitchGLU sorts, and decode steps it does not."""
    adapters = {
        "experts": save_adapter(tmp_path / "experts", "gpt_oss", seed=9, keys=EXPERTS),
        "attn": save_adapter(tmp_path / "attn", "gpt_oss", seed=8, keys=ATTENTION + ["mlp.router"]),
    }
    engine = _engine("gpt_oss", tiny_tokenizer, adapters, quantized, max_num_batched_tokens=64)
    names = ["experts", "attn", None, "experts"]
    prompts = random_prompts([40, 40, 33, 45], seed=10)
    outs = engine.generate([PromptInput(p, adapter=n) for p, n in zip(prompts, names)], GREEDY)
    want = _oracle("gpt_oss", adapters, names, prompts, 8, quantized)
    assert [o.token_ids for o in outs] == want
    assert want[0] != _oracle("gpt_oss", adapters, [None], prompts[:1], 8, quantized)[0]


MLA = ["self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa"]


def test_mla_projections_adapted(tmp_path, tiny_tokenizer):
    """deepseek_v3: an adapter of its MLA projections (the two down-projections read the same
    input: one product for both) and its output projection, beside the base in one batch."""
    keys = MLA + ["self_attn.o_proj"]
    adapters = {"mla": save_adapter(tmp_path / "mla", "deepseek_v3", seed=13, keys=keys)}
    engine = _engine("deepseek_v3", tiny_tokenizer, adapters)
    names = ["mla", None, "mla"]
    prompts = random_prompts([21, 14, 30], seed=14)
    outs = engine.generate([PromptInput(p, adapter=n) for p, n in zip(prompts, names)], GREEDY)
    want = _oracle("deepseek_v3", adapters, names, prompts, 8)
    assert [o.token_ids for o in outs] == want
    assert want[0] != _oracle("deepseek_v3", adapters, [None], prompts[:1], 8)[0]


def test_shapes_checked_at_load_naming_the_layer(tmp_path, tiny_tokenizer):
    """An adapter of another model (a wider down_proj) and one with no rank are refused."""
    adapter = save_adapter(tmp_path / "wide", seed=1, keys=["mlp.down_proj"])
    weights = mx.load(str(adapter / "adapters.safetensors"))
    name = "model.layers.1.mlp.down_proj.lora_a"
    weights[name] = mx.zeros((256, weights[name].shape[1]))
    mx.save_safetensors(str(adapter / "adapters.safetensors"), weights)
    with pytest.raises(AdapterError, match=r"layer model\.layers\.1\.mlp\.down_proj.*256"):
        _engine("qwen3", tiny_tokenizer, {"wide": adapter})
    weights = {"lm_head.lora_a": mx.zeros((64, 4)), "lm_head.lora_b": mx.zeros((4, 384))}
    mx.save_safetensors(str(adapter / "adapters.safetensors"), weights)
    with pytest.raises(AdapterError, match="layer lm_head: outside the decoder layers"):
        _engine("llama", tiny_tokenizer, {"head": adapter})
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match="has no 'rank'"):
        _engine("qwen3", tiny_tokenizer, {"wide": adapter})


def test_an_unknown_adapter_is_refused(tmp_path, tiny_tokenizer):
    engine = _engine("qwen3", tiny_tokenizer, _adapters(tmp_path))
    with pytest.raises(ValueError, match="no adapter 'nope'.*attn"):
        engine.add_request(PromptInput("hello", adapter="nope"), GREEDY)


def test_the_disk_tier_keeps_each_adapters_blocks_apart(tmp_path, tiny_tokenizer):
    """An engine writes a prompt's blocks under one adapter and exits; after a restart the base
    and another adapter read none of them from disk, the same adapter reads them all, and its
    tokens are still mlx-lm's."""
    adapters = _adapters(tmp_path / "adapters")
    prompt = random_prompts([41], seed=11)[0]  # 5 full blocks of 8 before its last token
    disk = dict(disk_cache_dir=str(tmp_path / "kv"))
    first = _engine("qwen3", tiny_tokenizer, adapters, **disk)
    first.generate([PromptInput(prompt, adapter="attn")], GREEDY)
    first.close()
    names = [None, "mlp", "attn"]
    again = _engine("qwen3", tiny_tokenizer, adapters, **disk)
    outs = [again.generate([PromptInput(prompt, adapter=n)], GREEDY)[0] for n in names]
    assert [o.metrics.disk_cached_tokens for o in outs] == [0, 0, 40]
    assert [o.token_ids for o in outs] == _oracle("qwen3", adapters, names, [prompt] * 3, 8)
    again.close()


def test_speculative_verification_and_compiled_steps_keep_each_adapter(
    tmp_path, tiny_tokenizer, eager_speculation
):
    """ngram drafts verified under each request's adapter, and decode steps compiled from the
    first (those of the base alone: a step with adapter rows runs uncompiled); tokens unchanged."""
    adapters = _adapters(tmp_path)
    names = ["attn", None, "all", None]
    prompts = [p * 3 for p in random_prompts([6, 5, 7, 4], seed=12)]  # repeats: drafts found
    want = _oracle("qwen3", adapters, names, prompts, 12)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    inputs = [PromptInput(p, adapter=n) for p, n in zip(prompts, names)]
    ngram = dict(speculative="ngram", num_speculative_tokens=3)
    for extra in (ngram, dict(compile_decode_after=0)):
        engine = _engine("qwen3", tiny_tokenizer, adapters, **extra)
        outs = engine.generate(inputs, params) + engine.generate(inputs[1:2], params)
        assert [o.token_ids for o in outs] == want + want[1:2]
        if "speculative" in extra:
            assert engine.stats().speculation.drafted > 0
        else:
            assert engine.runner.compiled.compiled_shapes > 0
