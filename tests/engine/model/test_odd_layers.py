"""Families whose layers are built unlike the usual decoder (tests/support/tiny_odd.py says how
each one differs), held to mlx-lm's own greedy generation through the packed, paged engine:
several requests batched with chunked prefill, and preemption for the recurrent-only ones. The
ones the engine cannot run are refused at load with their reason, by the families table and,
without its entry, by the probe itself: never a crash, never a wrong answer."""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_lm_load

from macbatch.engine import Engine, EngineConfig, SamplingParams, UnsupportedModelError
from macbatch.engine.model import families
from macbatch.engine.model.families import checkpoint_type
from macbatch.models.check import check_model
from tests.support.odd_model import ODD_TYPE, save_odd_model
from tests.support.oracle import assert_matches_mlx_lm, assert_pool_idle, mlx_lm_greedy
from tests.support.refusals import assert_refused_at_load
from tests.support.staggered import (
    GREEDY,
    STAGGERED,
    assert_preemption_recomputes_identically,
    assert_staggered_batch_matches_mlx_lm,
    random_prompts,
)
from tests.support.tiny import build_model, save_model
from tests.support.tiny_odd import ODD_CONFIGS, REFUSED_ODD_CONFIGS

WITH_LOGPROBS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)


@pytest.mark.parametrize("arch", list(ODD_CONFIGS))
def test_staggered_batch_with_chunked_prefill(arch, tiny_tokenizer):
    """Nine requests join at different steps, the longer prompts split over several steps."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(**STAGGERED))
    assert_staggered_batch_matches_mlx_lm(engine, model)


def test_kv_reuse_layers_read_the_last_cached_layers_pages(tiny_tokenizer):
    """AFM 7's KV-reuse layers attend over the last cached layer's K/V, handed as arrays
    (hooks/reused_kv.py): three prompts batched, two prefilled in chunks, give mlx-lm's own
    tokens and log-probabilities. Its K/V are fake-quantized at scales that keep them (the
    checkpoint's; 1.0, the classes' own, rounds a tiny model's rows to a few integers)."""
    model = build_model("afm7")
    for layer in model.model.layers:
        layer.self_attn.quant_key_scale = mx.array(1 / 32)
        layer.self_attn.quant_value_scale = mx.array(1 / 256)
    config = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    engine = Engine(model, tiny_tokenizer, config)
    prompts = random_prompts([5, 37, 20], seed=1)
    for prompt, out in zip(prompts, engine.generate(prompts, WITH_LOGPROBS)):
        assert_matches_mlx_lm(model, prompt, out)
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ["bailing_moe_linear", "recurrent_gemma", "iquestloopcoder"])
def test_preemption_recomputes_identically(arch, tiny_tokenizer):
    """A pool too small for everyone preempts; the recomputed requests give mlx-lm's tokens
    (GLA and RG-LRU layers from a fresh state, the second loop's window pages anew)."""
    assert_preemption_recomputes_identically(build_model(arch), tiny_tokenizer)


def test_tiled_kv_heads_are_read_in_their_order(tiny_tokenizer):
    """PLaMo tiles its K/V heads (query head h reads K/V head h % 2), where the kernels group
    them (h // 2): the probe finds the order, and the step reorders the queries by it."""
    engine = Engine(build_model("plamo"), tiny_tokenizer, EngineConfig(num_blocks=16))
    assert engine.runner.adapter.head_orders == [(0, 2, 1, 3)] * 2


@pytest.mark.parametrize("arch", ["mamba", "mamba2", "rwkv7"])
def test_a_recurrent_only_model_pages_nothing_and_survives_preemption(arch, tiny_tokenizer):
    """No attention layer: the full group's blocks hold no pages (they still count positions
    and carry the prefix cache), and a preempted request recomputes from a fresh state."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=16))
    assert engine.runner.adapter.layer_shapes == [] and engine.runner.adapter.hybrid
    assert_preemption_recomputes_identically(model, tiny_tokenizer)


def test_doctor_shows_a_recurrent_only_model(tmp_path: Path):
    report = check_model(str(save_model(tmp_path / "mamba2", "mamba2")))
    rows = dict(report.rows)
    assert report.servable, report.problem
    assert rows["layers"] == "2 (2 recurrent, no KV pages)"
    assert rows["KV bytes/token"].startswith("0 ")


def test_a_ling_checkpoint_is_read_by_its_architecture(tmp_path: Path):
    """Ling 2.5's checkpoints say ``model_type: bailing_hybrid`` with the architecture
    ``BailingMoeV3ForCausalLM``, which mlx-lm runs as ``bailing_moe_v3``: the table reads it so,
    and ``Engine.load`` gives the tokens of ``mlx_lm.load`` on the same files."""
    assert checkpoint_type("bailing_hybrid", ["BailingMoeV3ForCausalLM"]) == "bailing_moe_v3"
    assert checkpoint_type("bailing_hybrid") == "bailing_hybrid"
    named = dict(model_type="bailing_hybrid", architectures=["BailingMoeV3ForCausalLM"])
    path = save_model(tmp_path / "ling", "bailing_moe_v3", **named)
    model, _ = mlx_lm_load(str(path))
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, max_num_batched_tokens=16))
    assert engine.runner.adapter.model_type == "bailing_moe_v3"
    prompts = random_prompts([7, 30, 3], seed=2)
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY)):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize("arch", [a for a in REFUSED_ODD_CONFIGS if families.family(a).refusal])
def test_refused_at_load_with_its_reason(arch, tiny_tokenizer):
    assert_refused_at_load(arch, tiny_tokenizer)


@pytest.mark.parametrize(
    "arch, why",
    [
        ("baichuan_m1", "keeps recurrent state inside its attention layers"),
        ("llama4", "maybe_trim_front"),
    ],
)
def test_without_its_entry_the_probe_refuses_it(arch, why, tiny_tokenizer, monkeypatch):
    """What the table says of each is also what the probe finds: a family added upstream after
    this table is refused at load, with the layer or cache kind, rather than crash or answer
    wrong."""
    monkeypatch.delitem(families.FAMILIES, arch)
    with pytest.raises(UnsupportedModelError, match=f"model type '{arch}'.*{re.escape(why)}"):
        Engine(build_model(arch), tiny_tokenizer, EngineConfig(num_blocks=16))


def test_a_model_whose_layers_use_their_cache_oddly_is_refused_by_load_and_doctor(tmp_path):
    """An architecture the table has never heard of, whose attention calls a method of mlx-lm's
    cache the paged cache does not have: ``Engine.load`` (what serve, run and chat load with)
    refuses it naming the model type and the method, and doctor says the same."""
    path = save_odd_model(tmp_path / "odd")
    why = f"model type '{ODD_TYPE}': its forward failed on the engine's paged cache"
    with pytest.raises(UnsupportedModelError, match=f"{re.escape(why)}.*is_trimmable"):
        Engine.load(str(path), EngineConfig(num_blocks=16))
    report = check_model(str(path))
    assert not report.servable
    assert report.problem is not None and why in report.problem
    assert "is_trimmable" in report.problem


@pytest.mark.parametrize("arch", ["mamba2", "rwkv7"])
def test_a_recurrent_only_conversation_resumes_from_state_checkpoints(arch, tiny_tokenizer):
    """Each turn's prompt is the last turn's prompt and reply plus new tokens: from turn 2 on
    the request resumes at a state checkpoint of the prefix cache (its blocks hold no pages),
    and its tokens stay mlx-lm's."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, block_size=8))
    prompt: list[int] = []
    cached = []
    for new in random_prompts([30, 9, 17], seed=7):
        prompt = prompt + new
        [out] = engine.generate([prompt], GREEDY)
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
        cached.append(out.metrics.cached_tokens)
        prompt = prompt + out.token_ids
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
