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
    successors: dict[int, int] = {}
    for token, successor in zip(script, script[1:]):
        if successors.setdefault(token, successor) != successor:
            raise ValueError(f"token {token} comes back in the script with another successor")
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
    embed = model.model.embed_tokens.weight
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head = mx.zeros_like(model.lm_head.weight)
    head[mx.array(script[1:])] = 100.0 * unit[mx.array(script[:-1])]
    model.lm_head.weight = head
    mx.eval(model.parameters())
    return model
