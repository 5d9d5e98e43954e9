"""Adapters loaded and unloaded while an engine serves (``Engine.load_adapter`` /
``unload_adapter``, serve's adapters on first use): after each change every request's greedy
tokens still equal mlx-lm's own generation with its adapter loaded, a freed slot serves the next
adapter, and an adapter a request still names is not unloaded."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, PromptInput, SamplingParams
from macbatch.engine.lora.files import AdapterError
from tests.support.lora import ATTENTION, MLP, adapted_model, base_model, save_adapter
from tests.support.oracle import mlx_lm_greedy
from tests.support.staggered import random_prompts

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
EXPERTS = ["mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj"]


def _check(engine, arch, adapters, names, prompts) -> None:
    outs = engine.generate([PromptInput(p, adapter=n) for p, n in zip(prompts, names)], GREEDY)
    models = {n: adapted_model(arch, adapters.get(n), False) for n in set(names)}
    want = [mlx_lm_greedy(models[n], p, GREEDY.max_tokens) for n, p in zip(names, prompts)]
    assert [o.token_ids for o in outs] == want


def test_loaded_unloaded_and_a_freed_slot_reused(tmp_path, tiny_tokenizer):
    adapters = {
        "attn": save_adapter(tmp_path / "attn", seed=1, keys=ATTENTION, rank=4),
        "mlp": save_adapter(tmp_path / "mlp", seed=2, keys=MLP, rank=8, num_layers=1),
        "all": save_adapter(tmp_path / "all", seed=3, rank=2, scale=4.0),
    }
    engine = Engine(base_model("qwen3", False), tiny_tokenizer, EngineConfig(num_blocks=96))
    prompts = random_prompts([9, 21, 14], seed=4)
    assert engine.load_adapter("attn", str(adapters["attn"])).slot == 1
    assert engine.load_adapter("mlp", str(adapters["mlp"])).slot == 2
    _check(engine, "qwen3", adapters, ["attn", "mlp", None], prompts)
    assert engine.unload_adapter("attn")
    assert "attn" not in engine.info.model.adapters
    assert engine.load_adapter("all", str(adapters["all"])).slot == 1  # the freed slot
    _check(engine, "qwen3", adapters, ["all", "mlp", None], prompts)
    assert engine.unload_adapter("mlp")  # the last slot: the stacks shrink
    _check(engine, "qwen3", adapters, ["all", None, "all"], prompts)
    with pytest.raises(AdapterError, match="loaded already"):
        engine.load_adapter("all", str(adapters["all"]))


def test_an_adapter_a_request_names_stays(tmp_path, tiny_tokenizer):
    path = save_adapter(tmp_path / "attn", seed=1, keys=ATTENTION)
    engine = Engine(base_model("qwen3", False), tiny_tokenizer, EngineConfig(num_blocks=96))
    engine.load_adapter("attn", str(path))
    engine.add_request(PromptInput(random_prompts([6])[0], adapter="attn"), GREEDY)
    assert not engine.unload_adapter("attn")
    while engine.has_unfinished():
        engine.step()
    assert engine.unload_adapter("attn") and not engine.unload_adapter("attn")


def test_moe_experts_adapted_after_load(tmp_path, tiny_tokenizer):
    """gpt_oss: the experts' adapter and then an attention one, loaded into a serving engine."""
    adapters = {
        "experts": save_adapter(tmp_path / "experts", "gpt_oss", seed=9, keys=EXPERTS),
        "attn": save_adapter(tmp_path / "attn", "gpt_oss", seed=8, keys=ATTENTION),
    }
    config = EngineConfig(num_blocks=96, max_num_batched_tokens=64)
    engine = Engine(base_model("gpt_oss", False), tiny_tokenizer, config)
    prompts = random_prompts([40, 33, 12], seed=10)
    for name, path in adapters.items():
        engine.load_adapter(name, str(path))
    _check(engine, "gpt_oss", adapters, ["experts", "attn", None], prompts)
