"""A model that says a given token sequence: each token's successor is fixed by its weights.

Built from mlx-lm's own classes (untied llama/qwen3): attention and MLP outputs are zeroed so
the last hidden state is the current token's embedding, and the LM head maps each token's
(normalized) embedding to its successor. The tokens of the script must all differ, so each has
one successor. Real tokenizers then have to turn known ids into text, which is what is tested.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from tests.support.tiny import build_model


def scripted_model(arch: str, vocab_size: int, script: list[int]) -> nn.Module:
    """A model whose greedy continuation of ``script[i]`` is ``script[i + 1]``."""
    if len(set(script)) != len(script):
        raise ValueError("a scripted sequence must not repeat a token")
    model = build_model(arch, vocab_size=vocab_size, tie_word_embeddings=False)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    embed = model.model.embed_tokens.weight
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head = mx.zeros_like(model.lm_head.weight)
    head[mx.array(script[1:])] = 100.0 * unit[mx.array(script[:-1])]
    model.lm_head.weight = head
    mx.eval(model.parameters())
    return model
