"""Eagle-3 drafters for the tiny targets: random ones, ones built to agree with the target, and
checkpoints in the Hugging Face layout SGLang / SpecForge publish (``LlamaForCausalLMEagle3``:
Llama's config fields, ``draft_vocab_size``, ``eagle_config``; weights ``fc``, ``midlayer.*``,
``norm``, ``lm_head``, ``d2t``, ``t2d``), written here by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from macbatch.engine.model.adapter import text_model
from macbatch.engine.speculative.eagle3_model import Eagle3Config, Eagle3Model
from tests.support.mtp import scale_outputs
from tests.support.oracle import layer_outputs

HEADS, KV_HEADS = 4, 2


def eagle3_config(target: nn.Module, draft_vocab: int | None = None, **extra: Any) -> dict:
    """An Eagle-3 checkpoint's ``config.json`` for ``target`` (as SGLang's: Llama fields, one
    layer, the draft vocabulary, the target layers under ``eagle_config``)."""
    args = text_model(target).args
    hidden, layers = int(args.hidden_size), int(args.num_hidden_layers)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": hidden // KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "vocab_size": int(args.vocab_size),
        "draft_vocab_size": draft_vocab or int(args.vocab_size),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [0, layers // 2, layers - 1],
            "use_aux_hidden_state": True,
        },
        **extra,
    }


def _model(raw: dict, target: nn.Module) -> Eagle3Model:
    model = Eagle3Model(Eagle3Config.from_dict(raw), int(text_model(target).args.hidden_size))
    model.set_dtype(mx.float32)
    return model


def random_eagle3(target: nn.Module, seed: int = 3, draft_vocab: int | None = None) -> Eagle3Model:
    """An Eagle-3 drafter for ``target`` with random weights (its drafts mostly fail) and a
    random draft vocabulary of ``draft_vocab`` of the target's ids (its ``d2t``)."""
    mx.random.seed(seed)
    raw = eagle3_config(target, draft_vocab)
    model = _model(raw, target)
    ids = np.sort(np.random.default_rng(seed).permutation(raw["vocab_size"])[: len(model.d2t)])
    model.d2t = mx.array(ids - np.arange(len(ids)), dtype=mx.int32)
    mx.eval(model.parameters())
    return model


def agreeing_eagle3(target: nn.Module, scale: float = 0.05, attention: float = 6.0) -> Eagle3Model:
    """Scales ``target``'s layers' output projections down (in place: its next token is then
    nearly a function of the current one, as tests/support/mtp.py's predicting MTP layer makes
    it) and returns a drafter computing that function of the token each row reads: ``fc`` is
    zero (the target's features add nothing), each row's attention (RoPE all but switched off
    by a linear scaling) finds the rows reading the same token through keys and queries of the
    embedding (``attention`` their scale) and passes its embedding on, a large output
    projection outweighs the residual, the MLP adds nothing, the last norm is the target's and
    its LM head is the target's over a permuted draft vocabulary (``d2t`` undoes it). So its
    first draft mostly holds, and the rest where the target repeats its token."""
    text = scale_outputs(target, scale)
    raw = eagle3_config(target, rope_scaling={"type": "linear", "factor": 1e6})
    model = _model(raw, target)
    embed = text.model.embed_tokens.weight
    dim = embed.shape[1]
    head = getattr(text, "lm_head", None)
    weight = head.weight if head is not None else embed
    order = np.random.default_rng(0).permutation(weight.shape[0])
    model.lm_head.weight = weight[mx.array(order)]
    model.d2t = mx.array(order - np.arange(len(order)), dtype=mx.int32)
    model.fc.weight = mx.zeros_like(model.fc.weight)
    embedding_part = mx.concatenate([mx.eye(dim), mx.zeros((dim, dim))], axis=1)  # [dim, 2*dim]
    per_kv = embedding_part.reshape(KV_HEADS, dim // KV_HEADS, 2 * dim)
    repeat = HEADS // KV_HEADS
    layer = model.midlayer
    layer.self_attn.k_proj.weight = attention * embedding_part
    queries = mx.repeat(per_kv, repeat, axis=0).reshape(-1, 2 * dim)  # each head its KV head's
    layer.self_attn.q_proj.weight = attention * queries
    layer.self_attn.v_proj.weight = embedding_part
    # each KV head's values go out through the query heads that read it
    spread = mx.repeat(mx.eye(dim).reshape(KV_HEADS, dim // KV_HEADS, dim), repeat, axis=0)
    layer.self_attn.o_proj.weight = 1e4 * spread.reshape(-1, dim).T / repeat
    layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    model.norm.weight = text.model.norm.weight
    mx.eval(model.parameters(), target.parameters())
    return model


def save_eagle3_checkpoint(path: Path, model: Eagle3Model, target: nn.Module, **extra: Any) -> Path:
    """``model`` as an SGLang-layout Eagle-3 checkpoint at ``path``: its config, its weights
    under their names, ``t2d`` (which target ids the draft vocabulary holds) beside them."""
    path.mkdir(parents=True, exist_ok=True)
    raw = eagle3_config(target, len(model.d2t), **extra)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    weights = dict(tree_flatten(model.parameters()))
    ids = np.asarray(model.d2t) + np.arange(len(model.d2t))
    t2d = np.zeros(raw["vocab_size"], dtype=bool)
    t2d[ids] = True
    weights["d2t"] = model.d2t.astype(mx.int64)  # as published: int64
    weights["t2d"] = mx.array(t2d)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def mlx_vlm_drafts(path: Path, target: nn.Module, tokens: list[int], k: int) -> list[int]:
    """mlx-vlm 0.7.10's own Eagle-3 drafter with the weights of the checkpoint at ``path``
    (``midlayer`` is its ``layers.0``), drafting ``k`` tokens after ``tokens`` greedily: its
    context the outputs of ``target``'s layers at the checkpoint's aux layer ids (run here layer
    by layer over mlx-lm's causal mask) at positions ``0..len-2``, its cache its own."""
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel, ModelConfig, TextConfig

    raw = json.loads((path / "config.json").read_text())
    fields = TextConfig.__dataclass_fields__
    text = TextConfig(**{k: v for k, v in raw.items() if k in fields})
    drafter = Eagle3DraftModel(
        ModelConfig(transformer_layer_config=text, draft_vocab_size=raw["draft_vocab_size"])
    )
    stored = dict(mx.load(str(path / "model.safetensors")))  # type: ignore[arg-type]
    weights = {k.replace("midlayer.", "layers.0."): v for k, v in stored.items()}
    weights["embed_tokens.weight"] = text_model(target).model.embed_tokens.weight
    drafter.load_weights(list(drafter.sanitize(weights).items()))
    drafter.reset(target)
    outputs = layer_outputs(target, tokens[:-1])
    ids = raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    hidden = mx.concatenate([outputs[i] for i in ids], axis=-1)
    prompt = mx.array([tokens[:-1]])
    drafter.prefill_from_target_hidden(prompt, hidden, tokens[-1], None, greedy=True)
    drafts = drafter.draft_block(tokens[-1], hidden, None, k + 1, None, greedy=True)
    return [int(t) for t in drafts.reshape(-1).tolist()]
