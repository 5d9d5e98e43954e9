"""Greedy tokens through the packed, paged engine equal mlx-lm's own single-request generation."""

from __future__ import annotations

import pytest

import macbatch.metal as metal
from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import (
    GREEDY,
    STAGGERED,
    assert_preemption_recomputes_identically,
    assert_staggered_batch_matches_mlx_lm,
)
from tests.support.staggered import random_prompts as _prompts
from tests.support.tiny import ARCH_CONFIGS, build_model


def _staggered_matches_mlx_lm(arch: str, tokenizer) -> None:
    model = build_model(arch)
    engine = Engine(model, tokenizer, EngineConfig(**STAGGERED))
    assert_staggered_batch_matches_mlx_lm(engine, model)


@pytest.mark.parametrize("arch", list(ARCH_CONFIGS))
def test_staggered_batch_with_chunked_prefill(arch, tiny_tokenizer):
    """Nine requests of different lengths join at different steps; a 24-token budget chunks the
    longer prompts (some longer than the whole budget) across steps. Attention runs on this
    machine's kernel (the CPU kernel without Metal)."""
    _staggered_matches_mlx_lm(arch, tiny_tokenizer)
    assert "kernel" in metal.attention_backend().split(" (")[0].lower()


@pytest.mark.parametrize("arch", ["gemma3_text", "gpt_oss"])
def test_staggered_batch_through_the_reference(arch, tiny_tokenizer, monkeypatch):
    """The same through the pure-MLX reference, the kernels' oracle and fallback."""
    monkeypatch.setenv(metal.ENV, "reference")
    _staggered_matches_mlx_lm(arch, tiny_tokenizer)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])
def test_preemption_recomputes_identically(arch, tiny_tokenizer):
    """A pool too small for everyone forces preemption; outputs are unchanged."""
    assert_preemption_recomputes_identically(build_model(arch), tiny_tokenizer)


def test_edge_lengths(tiny_tokenizer):
    """One-token prompt, max_tokens 1, and a prompt longer than the step budget."""
    model = build_model("llama")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, max_num_batched_tokens=16))
    cases = [
        (_prompts([1])[0], 6),
        (_prompts([9], seed=1)[0], 1),
        (_prompts([70], seed=2)[0], 5),
    ]
    outs = engine.generate(
        [p for p, _ in cases],
        [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in cases],
    )
    for (prompt, n), out in zip(cases, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, n)
        assert out.finish_reason == "length"
    assert_pool_idle(engine)


def test_text_and_chat_prompts_match_mlx_lm(tiny_tokenizer):
    """Text prompts are encoded and chat messages templated exactly as mlx-lm's tokenizer does."""
    model = build_model("qwen3")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    text_out, chat_out = engine.generate(["the quick brown fox", messages], GREEDY)
    text_ids = tiny_tokenizer.encode("the quick brown fox")
    chat_ids = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text_out.token_ids == mlx_lm_greedy(model, text_ids, GREEDY.max_tokens)
    assert chat_out.token_ids == mlx_lm_greedy(model, chat_ids, GREEDY.max_tokens)
    assert text_out.text == tiny_tokenizer.decode(text_out.token_ids)
