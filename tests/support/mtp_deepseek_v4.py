"""DeepSeek V4's MTP layer for the tests: random ones, one that predicts the target's next
token, mlx-vlm's own ``deepseek_v4_mtp`` drafter loaded with an ``MtpHead``'s weights (the
drafts' oracle), and the tiny DeepSeek V4 checkpoint with its MTP layer under ``mtp.0.`` in
DeepSeek's release names, written here by hand, in float or in the release's fp8 / fp4."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from macbatch.engine.speculative.mtp_model import MtpHead
from tests.support.mtp import random_mtp_head
from tests.support.mtp_fp8 import V4_RELEASE_CONFIG, Fp8Layer, mark_e4m3
from tests.support.tiny import randomize
from tests.support.tiny_deepseek_v4 import CONFIG, save_deepseek_v4

# the parameters mlx-vlm creates as zeros or ones: random here, so each acts
_RANDOMIZED = ("attn_hc.fn", "attn_hc.base", "ffn_hc.fn", "ffn_hc.base", "hc_head.fn",
               "hc_head.base", "attn_sink", "e_score_correction_bias")  # fmt: skip
# the projections that write a block's branch into its streams
_OUTPUTS = ("attn.wo_b.weight", "down_proj.weight")
# the drafter's names of the checkpoint's hyper-connection parts and expert projections
_HC = {f"{sub}_hc.{p}": f"hc_{sub}_{p}" for sub in ("attn", "ffn") for p in ("fn", "base", "scale")}
_W = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def random_v4_head(model: nn.Module, seed: int = 1) -> MtpHead:
    """A random MTP layer for the DeepSeek V4 ``model``, its hyper-connections' mixes, sinks
    and router bias random too."""
    head = random_mtp_head(model, seed)
    randomize(head, _RANDOMIZED, 0.5)
    mx.eval(head.parameters())
    return head


def predicting_v4_head(model: nn.Module, scale: float = 0.05) -> MtpHead:
    """Scales the branch outputs of ``model``'s blocks by ``scale`` (in place; its streams stay
    near the embedding, so its next token is nearly a function of the current one) and returns
    an MTP layer computing that function: ``e_proj`` passes the normed embedding into every
    stream, ``h_proj`` and its block's projections are zero (the block adds nothing), its head
    and norm are the target's."""
    text = model.language_model
    scaled = [
        (k, v * scale)
        for k, v in tree_flatten(text.parameters())
        if k.startswith("model.layers.") and k.endswith(_OUTPUTS)
    ]
    text.load_weights(scaled, strict=False)
    head = random_v4_head(model)
    block = head.layers[0]
    zeros = [(k, mx.zeros_like(v)) for k, v in tree_flatten(block.parameters())]
    block.load_weights([(k, v) for k, v in zeros if k.endswith("_proj.weight")], strict=False)
    width = int(CONFIG["hidden_size"])
    head.e_proj.weight = mx.eye(width)
    head.h_proj.weight = mx.zeros((width, width))
    head.hc_head.load_weights(tree_flatten(text.model.hc_head.parameters()), strict=True)
    head.norm.weight = text.model.norm.weight
    mx.eval(model.parameters(), head.parameters())
    return head


def mlx_vlm_v4_drafts(model: nn.Module, head: MtpHead, tokens: list[int], k: int) -> list[int]:
    """The ``k`` greedy drafts after ``tokens`` of mlx-vlm's own ``DeepseekV4MTPDraftModel``
    with ``head``'s weights, bound to the DeepSeek V4 ``model`` (``drafter_v4_drafts``)."""
    from mlx_vlm.speculative.drafters.deepseek_v4_mtp import DeepseekV4MTPDraftModel, ModelConfig

    drafter = DeepseekV4MTPDraftModel(ModelConfig(text_config=model.language_model.args))
    weights = [(_drafter_name(n), v) for n, v in tree_flatten(head.parameters())]
    drafter.load_weights(weights, strict=True)
    return drafter_v4_drafts(drafter, model, tokens, k)


def drafter_v4_drafts(drafter: Any, model: nn.Module, tokens: list[int], k: int) -> list[int]:
    """The ``k`` greedy drafts after ``tokens`` of mlx-vlm's ``drafter`` bound to the DeepSeek
    V4 ``model``: its prefill over the streams of mlx-vlm's one forward of all but the last
    token (that one its bonus), then its draft block, on its own rotating window cache."""
    text = model.language_model
    drafter.reset(model)
    ids = mx.array([tokens[:-1]])
    out = text(ids, cache=text.make_cache(), return_hidden=True)
    streams = out.hidden_states[0]
    drafter.prefill_from_target_hidden(ids, streams, tokens[-1], None, greedy=True)
    drafts = drafter.draft_block(tokens[-1], streams[:, -1:], None, k + 1, None, greedy=True)
    return [int(t) for t in drafts[0].tolist()]


def _drafter_name(name: str) -> str:
    return "decoder." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def save_v4_checkpoint(
    path: Path, encoding: Callable[[dict[str, mx.array]], Fp8Layer] | None = None, **overrides: Any
) -> Fp8Layer:
    """The tiny DeepSeek V4 (tests/support/tiny_deepseek_v4.py, ``overrides`` in its config)
    with a random MTP layer under ``mtp.0.`` in DeepSeek's release names (``attn.*``,
    ``ffn.experts.E.w1``, ``hc_attn_fn``, ``hc_head_fn``, ``ffn.gate.bias``, ``wo_a`` flat) and
    ``num_nextn_predict_layers: 1``, stored by ``encoding`` (None: float; else its codes typed
    as the release types them, its config's ``quantization_config`` the release's); returns
    the layer as stored and as the loader should hold it."""
    save_deepseek_v4(path, **overrides)
    from tests.support.tiny_deepseek_v4 import deepseek_v4_model

    weights = dict(tree_flatten(random_v4_head(deepseek_v4_model(**overrides)).parameters()))
    layer = Fp8Layer(weights, weights, {}) if encoding is None else encoding(weights)
    stored: dict[str, mx.array] = {}
    for name, value in layer.stored.items():
        key = name.removeprefix("layers.0.")
        key = _HC.get(key, key).replace("hc_head.", "hc_head_")
        key = key.replace("gate.e_score_correction_bias", "gate.bias")
        for ours, theirs in _W.items():
            key = key.replace(f"shared_experts.{ours}.", f"shared_experts.{theirs}.")
        if key.startswith("attn.wo_a."):
            value = value.reshape(-1, value.shape[-1])
        if key.startswith("ffn.switch_mlp."):
            _, _, proj, suffix = key.split(".")
            stored.update({f"ffn.experts.{e}.{_W[proj]}.{suffix}": w for e, w in enumerate(value)})
            continue
        stored[key] = value
    file = path / "model.safetensors"
    saved = dict(mx.load(str(file)))
    saved.update({f"mtp.0.{k}": v for k, v in stored.items()})
    mx.save_safetensors(str(file), saved)
    config = json.loads((path / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    if encoding is not None:
        mark_e4m3(file)
        config["quantization_config"] = V4_RELEASE_CONFIG
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return layer
