"""GLM5-next's MTP layer for the tests: mlx-vlm's own ``glm5_next_mtp`` drafter loaded with an
``MtpHead``'s weights (the drafts' oracle), and the tiny GLM5-next checkpoint with a random MTP
layer at decoder layer ``num_hidden_layers`` as the published checkpoints store it, written here
by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from macbatch.engine.speculative.mtp_model import MtpHead
from tests.support.mtp import random_mtp_head
from tests.support.tiny import randomize
from tests.support.tiny_glm5_next import GLM5_NEXT, TEXT_CONFIG

# MtpHead's parts by the names of mlx-vlm's drafter (its splitter's renames of the checkpoint's)
_DRAFTER_PARTS = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head_norm",
}
# ... and by the checkpoint's, relative to its layer ``num_hidden_layers``
_CHECKPOINT_PARTS = {**_DRAFTER_PARTS, "norm": "shared_head.norm"}
# where each layout puts the MTP layer: Hugging Face's, and mlx-vlm's own names
PREFIXES = {
    "hugging_face": f"model.language_model.layers.{TEXT_CONFIG['num_hidden_layers']}.",
    "mlx": f"language_model.model.layers.{TEXT_CONFIG['num_hidden_layers']}.",
}


def _renamed(name: str, parts: dict[str, str], block: str) -> str:
    part, _, rest = name.partition(".")
    if part == "layers":
        return block + rest.removeprefix("0.")
    return f"{parts[part]}.{rest}"


def random_glm5_head(model: nn.Module) -> MtpHead:
    """``random_mtp_head`` with the parameters mlx-vlm creates as zeros drawn at random too (the
    indexer's pooling gate and position bias, the router's correction bias), so each acts."""
    head = random_mtp_head(model)
    randomize(head, GLM5_NEXT.randomized, 0.3)
    mx.eval(head.parameters())
    return head


def mlx_vlm_glm5_drafts(model: nn.Module, head: MtpHead, tokens: list[int], k: int) -> list[int]:
    """The ``k`` greedy drafts after ``tokens`` of mlx-vlm's own ``Glm5NextMTPDraftModel`` with
    ``head``'s weights, bound to the GLM5-next ``model``: its prefill over mlx-vlm's normed
    hidden states of all but the last token (that one its bonus), then its draft block."""
    from mlx_vlm.speculative.drafters.glm5_next_mtp import Glm5NextMTPDraftModel, ModelConfig

    text = model.language_model
    drafter = Glm5NextMTPDraftModel(ModelConfig(text_config=text.args))
    weights = [(_renamed(n, _DRAFTER_PARTS, "mtp_block."), v) for n, v in _flat(head).items()]
    drafter.load_weights(weights, strict=True)
    drafter.reset(model)
    ids = mx.array([tokens[:-1]])
    hidden = text(ids, return_hidden=True).hidden_states[0]
    drafter.prefill_from_target_hidden(ids, hidden, tokens[-1], None, greedy=True)
    drafts = drafter.draft_block(tokens[-1], hidden[:, -1:], None, k + 1, None, greedy=True)
    return [int(t) for t in drafts[0].tolist()]


def _flat(head: MtpHead) -> dict[str, mx.array]:
    return dict(tree_flatten(head.parameters()))


def save_glm5_next_checkpoint(path: Path, layout: str) -> dict[str, mx.array]:
    """The tiny GLM5-next (tests/support/tiny_glm5_next.py) with a random MTP layer at decoder
    layer ``num_hidden_layers`` (``num_nextn_predict_layers: 1``) in ``layout``:
    "hugging_face" (``model.language_model.``, DeepSeek's ``q_a_proj`` and
    ``kv_a_proj_with_mqa``, ``kv_b_proj``, one projection per expert, the shared expert's
    ``gate_proj`` and ``up_proj``) or "mlx" (``language_model.model.``, mlx-vlm's names).
    mlx-vlm's ``sanitize`` drops that layer. Returns its weights as mlx-vlm holds them (the
    loader's expected result)."""
    GLM5_NEXT.save(path)
    expected = _flat(random_glm5_head(GLM5_NEXT.model()))
    layer = {_renamed(n, _CHECKPOINT_PARTS, ""): v for n, v in expected.items()}
    if layout == "hugging_face":
        layer = _hugging_face_layer(layer)
    file = path / "model.safetensors"
    saved = dict(mx.load(str(file)))
    saved.update({PREFIXES[layout] + k: v for k, v in layer.items()})
    mx.save_safetensors(str(file), saved)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return expected


def _hugging_face_layer(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The layer's weights (mlx-vlm's names) as a Hugging Face checkpoint stores them."""
    text: dict[str, Any] = TEXT_CONFIG
    out = dict(weights)
    fused = out.pop("self_attn.qkv_a_proj.weight")
    out["self_attn.q_a_proj.weight"] = fused[: text["q_lora_rank"]]
    out["self_attn.kv_a_proj_with_mqa.weight"] = fused[text["q_lora_rank"] :]
    wk = out.pop("self_attn.embed_q.weight")  # [heads, rank, nope]
    wv = out.pop("self_attn.unembed_out.weight")  # [heads, v, rank]
    kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)
    out["self_attn.kv_b_proj.weight"] = kv_b.reshape(-1, text["kv_lora_rank"])
    gate, up = mx.split(out.pop("mlp.shared_experts.gate_up_proj.weight"), 2, axis=0)
    out["mlp.shared_experts.gate_proj.weight"] = gate
    out["mlp.shared_experts.up_proj.weight"] = up
    for proj in ("gate_proj", "up_proj", "down_proj"):
        stacked = out.pop(f"mlp.switch_mlp.{proj}.weight")
        out.update({f"mlp.experts.{e}.{proj}.weight": w for e, w in enumerate(stacked)})
    return out
