"""A model that says a given token sequence: each token's successor is fixed by its weights.

Built from mlx-lm's own classes (untied llama/qwen3, gpt_oss's mixture of experts): attention
and MLP outputs are zeroed so the last hidden state is the current token's embedding, and the LM
head maps each token's (normalized) embedding to its successor. A token may come back in the
script only with the same successor (the model sees one token), so a script may end in a cycle.
Real tokenizers then have to turn known ids into text, which is what is tested.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from tests.support.tiny import build_model


def scripted_model(arch: str, vocab_size: int, script: list[int]) -> nn.Module:
    """A model whose greedy continuation of ``script[i]`` is ``script[i + 1]``."""
    model = _bigram_model(arch, vocab_size)
    model.lm_head.weight = _script_head(model, script, mx.zeros_like(model.lm_head.weight))
    mx.eval(model.parameters())
    return model


def opening_model(arch: str, vocab_size: int, script: list[int]) -> nn.Module:
    """A random bigram model (each token's successor drawn from its own random distribution)
    that follows ``script`` almost surely even at temperature 1: a reply that must open with
    known tokens (gpt-oss's analysis channel) and then says something different per seed."""
    model = _bigram_model(arch, vocab_size)
    head = model.lm_head.weight  # random rows: near-uniform next tokens
    # the scripted rows win by ~30 logits over the vocabulary (hidden states have norm ~sqrt(d))
    scale = 30.0 / head.shape[1] ** 0.5
    model.lm_head.weight = head + _script_head(model, script, mx.zeros_like(head), scale)
    mx.eval(model.parameters())
    return model


def _bigram_model(arch: str, vocab_size: int) -> nn.Module:
    """A random model whose last hidden state is the current token's embedding: attention and
    MLP outputs are zeroed."""
    model = build_model(arch, vocab_size=vocab_size, tie_word_embeddings=False)
    for layer in model.model.layers:
        mlp = layer.mlp
        for output in (
            layer.self_attn.o_proj,
            getattr(mlp, "down_proj", None) or mlp.experts.down_proj,
        ):
            for name in ("weight", "bias"):
                if name in output:
                    output[name] = mx.zeros_like(output[name])
    return model


def _script_head(model: nn.Module, script: list[int], head: mx.array, scale: float = 100.0):
    """``head`` with each scripted successor's row pointing at its predecessor's embedding."""
    successors: dict[int, int] = {}
    for token, successor in zip(script, script[1:]):
        if successors.setdefault(token, successor) != successor:
            raise ValueError(f"token {token} comes back in the script with another successor")
    embed = model.model.embed_tokens.weight
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head[mx.array(script[1:])] = scale * unit[mx.array(script[:-1])]
    return head
