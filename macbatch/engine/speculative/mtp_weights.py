"""A checkpoint's multi-token-prediction (MTP) weights, read from its safetensors files.

mlx-lm's ``sanitize`` drops every ``mtp.*`` weight of Qwen3.5 and Qwen3-Next checkpoints, so they
are read here, beside its load: only the files that hold them are opened (``mx.load`` reads an
array when it is used, so the rest of a file is never read). Names are made relative to the MTP
module (``fc.weight``, ``layers.0.self_attn.q_proj.weight`` ...) whatever prefix the checkpoint
puts before ``mtp.`` (Hugging Face: none; converted wrappers: ``language_model.`` or
``model.language_model.``). A Hugging Face-layout checkpoint (its recurrent convolutions not yet
moved to MLX's axis order) stores its RMSNorm weights zero-centred and its experts unstacked;
both are converted here as mlx-lm's ``sanitize`` converts the target's. No MLX at import: the
doctor reads the headers only.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from macbatch.engine.model.families import FAMILIES, family

if TYPE_CHECKING:
    import mlx.core as mx

# where converters put the MTP weights (longest first: the first that matches is stripped)
_PREFIXES = ("model.language_model.mtp.", "language_model.mtp.", "model.mtp.", "mtp.")
# the norms a Hugging Face checkpoint stores as (weight - 1): Qwen3-Next's RMSNorm scales by
# (1 + weight); MLX's by weight
_CENTRED_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)
_EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# the families whose MTP layer mtp_model.py builds (the families table says)
MTP_FAMILIES = tuple(name for name, record in FAMILIES.items() if record.mtp_layer)


def mtp_refusal(model_type: str) -> str | None:
    """Why a checkpoint of ``model_type`` cannot draft with MTP here (None: it can)."""
    record = family(model_type)
    if record.mtp_layer:
        return None
    return record.mtp_refusal or (
        f"model type '{model_type}' has no MTP layer ({', '.join(MTP_FAMILIES)} do)"
    )


def describe_mtp_heads(path: Path) -> str:
    """What ``macbatch doctor`` says of a checkpoint's MTP heads: whether it has them and
    whether ``--speculative auto`` drafts with them."""
    model_type = str(json.loads((path / "config.json").read_text()).get("model_type"))
    declared, stored = mtp_layer_count(path)
    if not stored:
        if declared:
            return (
                f"none: the config declares {declared} MTP layer(s) but the weights were "
                "dropped (mlx-lm's convert drops them); --speculative auto does not speculate"
            )
        return "none"
    reason = mtp_refusal(model_type)
    if reason:
        return f"{stored} MTP layer(s), not used: {reason}"
    return f"{stored} MTP layer(s): --speculative auto drafts with them (docs/speculative.md)"


def mtp_name(key: str) -> str | None:
    """``key`` relative to the MTP module (None: not an MTP weight)."""
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return None


def checkpoint_headers(path: Path) -> dict[str, dict[str, Any]]:
    """Every tensor of the checkpoint at ``path``: name -> its safetensors header entry (dtype,
    shape), read from the files' headers alone."""
    tensors: dict[str, dict[str, Any]] = {}
    for file in sorted(path.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        tensors.update({k: dict(v, file=file.name) for k, v in header.items()})
    return tensors


def mtp_layer_count(path: Path) -> tuple[int, int]:
    """(MTP layers the config declares, MTP layers whose weights the files hold)."""
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    declared = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
    layers = set()
    for key in checkpoint_headers(path):
        name = mtp_name(key)
        if name is not None and name.startswith("layers."):
            layers.add(int(name.split(".")[1]))
    return declared, len(layers)


def hugging_face_layout(headers: dict[str, dict[str, Any]]) -> bool:
    """Whether the checkpoint is still in Hugging Face's layout (mlx-lm's own test: a recurrent
    convolution's kernel axis last)."""
    return any("conv1d.weight" in k and v["shape"][-1] != 1 for k, v in headers.items())


def read_mtp_weights(path: Path) -> dict[str, mx.array]:
    """The MTP weights of the checkpoint at ``path``, named relative to the MTP module and in
    MLX's layout (norms uncentred, experts stacked as ``switch_mlp``)."""
    import mlx.core as mx

    headers = checkpoint_headers(path)
    files = sorted({v["file"] for k, v in headers.items() if mtp_name(k) is not None})
    weights: dict[str, mx.array] = {}
    for file in files:
        loaded = mx.load(str(path / file))
        assert isinstance(loaded, dict)  # a safetensors file: name -> array
        for key, value in loaded.items():
            name = mtp_name(key)
            if name is not None:
                weights[name] = value
    if not hugging_face_layout(headers):
        return weights
    weights = _stacked_experts(weights)
    return {k: v + 1.0 if _is_centred_norm(k, v) else v for k, v in weights.items()}


def _is_centred_norm(name: str, value: mx.array) -> bool:
    return value.ndim == 1 and (name == "norm.weight" or name.endswith(_CENTRED_NORMS))


def _stacked_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Experts as mlx-lm's ``SwitchGLU`` holds them: Qwen3-Next's one projection per expert
    (``experts.E.gate_proj``) stacked, Qwen3.5-MoE's fused ``gate_up_proj`` split."""
    import mlx.core as mx

    out = dict(weights)
    mlps = {k.split(".experts.")[0] for k in weights if ".mlp.experts." in k}
    for mlp in mlps:
        fused = out.pop(f"{mlp}.experts.gate_up_proj", None)
        if fused is not None:
            middle = fused.shape[-2] // 2
            out[f"{mlp}.switch_mlp.gate_proj.weight"] = fused[..., :middle, :]
            out[f"{mlp}.switch_mlp.up_proj.weight"] = fused[..., middle:, :]
            out[f"{mlp}.switch_mlp.down_proj.weight"] = out.pop(f"{mlp}.experts.down_proj")
            continue
        count = len({k for k in weights if k.startswith(f"{mlp}.experts.")}) // 3
        for proj in _EXPERT_PROJECTIONS:
            parts = [out.pop(f"{mlp}.experts.{e}.{proj}.weight") for e in range(count)]
            out[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack(parts)
    return out
