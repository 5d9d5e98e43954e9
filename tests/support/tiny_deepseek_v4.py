"""A tiny random DeepSeek V4 (mlx-vlm's ``deepseek_v4``, the layout of DeepSeek's released V4)
saved as an mlx-vlm conversion is (config.json, the weights under its model's own names, the
tiny tokenizer): a window of 8 in every layer, overlapping ratio-4 compression with a top-3
lightning-indexer selection (CSA) on layers 1 and 3, ratio-128 compression read whole (HCA) on
layer 2, four residual streams (hyper-connections) and layer 0's experts routed by token id.
A context past 12 tokens drops window rows and compressed rows; past 128, layer 2 reads one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE, randomize, save_checkpoint

WINDOW = 8
INDEX_TOPK = 3
CONFIG: dict[str, Any] = dict(
    model_type="deepseek_v4",
    architectures=["DeepseekV4ForCausalLM"],
    vocab_size=VOCAB_SIZE,
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=2,
    head_dim=32,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    o_groups=2,
    o_lora_rank=8,
    n_routed_experts=4,
    num_experts_per_tok=2,
    num_hash_layers=1,
    compress_ratios=[0, 4, 128, 4],
    sliding_window=WINDOW,
    index_n_heads=2,
    index_head_dim=16,
    index_topk=INDEX_TOPK,
    hc_sinkhorn_iters=3,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)
# parameters mlx-vlm creates as zeros or ones (hyper-connection mixes, sinks, the compressors'
# position biases): random here, so the test sees each of them act
_RANDOMIZED = ("attn_hc.fn", "attn_hc.base", "ffn_hc.fn", "ffn_hc.base", "hc_head.fn",
               "hc_head.base", "attn_sink", ".ape")  # fmt: skip


def deepseek_v4_model(seed: int = 0, **overrides: Any) -> Any:
    """mlx-vlm's own DeepSeek V4 of ``CONFIG`` (float32, random weights; each token of layer
    0's hash table routed to random experts)."""
    from mlx_vlm.models.deepseek_v4 import deepseek_v4
    from mlx_vlm.models.deepseek_v4.config import ModelConfig

    mx.random.seed(seed)
    config = ModelConfig.from_dict({**copy.deepcopy(CONFIG), **overrides})
    model = deepseek_v4.Model(config)
    model.set_dtype(mx.float32)
    randomize(model, _RANDOMIZED, 0.5)
    for layer in model.language_model.model.layers:
        gate = layer.ffn.gate
        if gate.hash:
            shape = gate.tid2eid.shape
            gate.tid2eid = mx.random.randint(0, config.n_routed_experts, shape).astype(mx.int32)
    return model


def save_deepseek_v4(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """The tiny checkpoint in ``path``; ``overrides`` merged into its config.json."""
    config = {**CONFIG, **overrides, "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>")}
    return save_checkpoint(path, deepseek_v4_model(seed, **overrides), config)


def reference_logprobs(model: Any, tokens: list[int]) -> np.ndarray:
    """The log-probabilities ``[T, V]`` (float64) after each of ``tokens``, from mlx-vlm's own
    forward of them all in one call on its own fresh caches: the one call where its compressed
    rows are DeepSeek's reference rows (every group pooled with its previous one), and so the
    oracle of what its reference inference gives token by token."""
    out = model.language_model(mx.array([tokens]), cache=model.language_model.make_cache())
    logits = np.asarray(out.logits[0].astype(mx.float32), dtype=np.float64)
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def assert_matches_reference(model: Any, prompt: list[int], out: Any) -> None:
    """The engine's greedy output ``out`` for ``prompt``: at each step the token the reference
    forward (``reference_logprobs`` of the prompt and the tokens before it) ranks first, at its
    log-probability."""
    tokens = [*prompt, *out.token_ids]
    steps = reference_logprobs(model, tokens[:-1])[len(prompt) - 1 :]
    assert out.token_ids == [int(np.argmax(step)) for step in steps]
    want = [float(step[token]) for step, token in zip(steps, out.token_ids, strict=True)]
    assert out.logprobs == pytest.approx(want, abs=1e-4)


def reference_greedy(model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """The reference's greedy tokens for ``prompt``: each the first of ``reference_logprobs``
    after the prompt and the tokens before it."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(reference_logprobs(model, tokens)[-1])))
    return tokens[len(prompt) :]
