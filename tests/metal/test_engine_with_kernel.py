"""The engine's greedy parity with mlx-lm, with the emulated Metal kernel as the attention path.

The engine looks ``macbatch.metal.paged_attention`` up at call time, so patching that name routes
every layer's attention through the kernel (run by the MSL emulator) for the whole generation.
"""

from __future__ import annotations

import numpy as np
import pytest

import macbatch.metal
from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.attention_cases import emulated_attention
from tests.support.msl.emulator import Emulator
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import VOCAB_SIZE, build_model


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])  # gemma3: sliding-window layers
def test_greedy_tokens_match_mlx_lm_through_the_kernel(arch, tiny_tokenizer, monkeypatch):
    emulator = Emulator()
    monkeypatch.setattr(macbatch.metal, "paged_attention", emulated_attention(emulator))
    model = build_model(arch)
    engine = Engine(
        model,
        tiny_tokenizer,
        EngineConfig(num_blocks=32, block_size=8, max_num_batched_tokens=16),
    )
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in (3, 21, 9)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens)
    assert emulator.dispatches, "attention never went through the emulated kernel"
