"""A checkpoint's multi-token-prediction (MTP) weights, read from its safetensors files.

mlx-lm's ``sanitize`` drops every MTP weight, so they are read here, beside its load: only the
files that hold them are opened (``mx.load`` reads an array when it is used, so the rest of a
file is never read). Seven naming schemes (``MtpNaming``, the families table says which a family
uses), each decided by one table (``_PARTS``, Nemotron-H's ``_NEMOTRON_PARTS``):

- Qwen3.5 and Qwen3-Next: under ``mtp.`` whatever prefix the checkpoint puts before it (Hugging
  Face: none; converted wrappers: ``language_model.`` or ``model.language_model.``); the decoder
  layers under ``mtp.layers.N.``, the rest (``fc``, ``pre_fc_norm_*``, ``norm``) once.
- DeepSeek V3 and GLM-4.5 (``num_nextn_predict_layers``): decoder layer ``num_hidden_layers`` of
  the checkpoint, its own weights beside ``eh_proj``, ``enorm``, ``hnorm`` and
  ``shared_head.norm``; its ``embed_tokens`` and ``shared_head.head`` are copies of the target's
  (DeepSeek-V3's report shares them, as vLLM does), so the target's serve and they are not read.
- Qwen4-exp: under ``mtp.`` as Qwen3.5's, its parts ``fc_embedding``, ``fc_hidden``,
  ``pre_fc_norm_*`` and ``hyper_connection_mixer`` (mlx-vlm's ``qwen4_exp_mtp`` names); its
  norms stay zero-centred (its own RMSNorm scales by 1 + w), its fused experts are split.
- GLM5-next: DeepSeek's names on decoder layer ``num_hidden_layers`` under its text model's
  prefix (``model.language_model.layers.N.``, or ``language_model.model.layers.N.`` as mlx-vlm
  saves it: the prefixes mlx-vlm's ``glm5_next_mtp`` splitter reads); its layer's weights go
  through that drafter's own ``sanitize`` (experts stacked, ``q_a_proj`` and
  ``kv_a_proj_with_mqa`` fused, ``kv_b_proj`` split), as the target's ``sanitize`` drops the layer.
- Hunyuan V4: under ``model.mtp_layers.N.``, DeepSeek's parts but ``final_layernorm`` for its
  norm (mlx-vlm's ``hy_v4_mtp`` drafter reads the same names).
- DeepSeek V4 (mlx-vlm's ``deepseek_v4``): DeepSeek's release names under ``mtp.N.`` (or bare
  ``mtp.``; the index is dropped, as mlx-vlm's ``deepseek_v4_mtp`` drafter drops it: its
  checkpoints ship one layer, at 0 or 1), read as that drafter's own ``sanitize`` reads them
  (``attn.*`` and ``ffn.*`` its block's, experts stacked, ``hc_*_fn`` / ``base`` / ``scale`` its
  hyper-connections', ``e_proj`` and ``h_proj`` apart); its release's fp4 experts and ue8m0
  block fp8 are packed as MLX's mxfp4 / mxfp8 layers first (``mtp_fp8.as_mx_layers``).
- Nemotron-H: one MTP module under ``mtp.``, its blocks (``mtp_hybrid_override_pattern``, e.g.
  ``*E``: attention, then MoE) under ``mtp.layers.N.``, the first's ``enorm``, ``hnorm`` and
  ``eh_proj`` and the last's ``final_layernorm`` beside them (mlx-vlm's ``nemotron_h_mtp``
  drafter reads the same names); the target's embedding and LM head serve.

Names are made relative to ``MtpHead`` (``fc.weight``, ``layers.0.self_attn.q_proj.weight``
...). A Hugging Face-layout Qwen checkpoint (its recurrent convolutions not yet moved to MLX's
axis order) stores its RMSNorm weights zero-centred and its experts unstacked; both are
converted here as mlx-lm's ``sanitize`` converts the target's. A DeepSeek/GLM or Hunyuan V4
layer (and Nemotron-H's blocks) goes through the target's own ``sanitize`` (experts stacked,
``kv_b_proj`` split, fp8 dequantized). No MLX at import: the doctor reads the headers only.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from macbatch.engine.model.families import FAMILIES, MtpNaming, family
from macbatch.engine.speculative.mtp_fp8 import (
    as_mx_layers,
    dequantized_blocks,
    is_mxfp8,
    is_ue8m0_fp8,
)

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

# where converters put Qwen's MTP weights (longest first: the first that matches is stripped)
_PREFIXES = ("model.language_model.mtp.", "language_model.mtp.", "model.mtp.", "mtp.")
# each scheme's name, relative to one MTP layer, of MtpHead's parts but its decoder layer
# (None: a copy of the target's, which serves instead)
_NEXTN_PARTS: dict[str, str | None] = {
    "eh_proj": "fc",
    "enorm": "pre_fc_norm_embedding",
    "hnorm": "pre_fc_norm_hidden",
    "shared_head.norm": "norm",
    "shared_head.head": None,
    "embed_tokens": None,
}
_PARTS: dict[MtpNaming, dict[str, str | None]] = {
    MtpNaming.QWEN: {
        "fc": "fc",
        "pre_fc_norm_embedding": "pre_fc_norm_embedding",
        "pre_fc_norm_hidden": "pre_fc_norm_hidden",
        "norm": "norm",
        "embed_tokens": "embed_tokens",
        "lm_head": "lm_head",
    },
    MtpNaming.NEXTN: _NEXTN_PARTS,
    MtpNaming.GLM5_NEXT: _NEXTN_PARTS,
    MtpNaming.QWEN4: {
        name: name
        for name in (
            "fc_embedding",
            "fc_hidden",
            "pre_fc_norm_embedding",
            "pre_fc_norm_hidden",
            "hyper_connection_mixer",
        )
    },
    MtpNaming.HY_V4: {
        "eh_proj": "fc",
        "enorm": "pre_fc_norm_embedding",
        "hnorm": "pre_fc_norm_hidden",
        "final_layernorm": "norm",
    },
}
# Nemotron-H's head parts on its blocks (``layers.N.<part>``), by MtpHead's names
_NEMOTRON_PARTS = {
    "enorm": "pre_fc_norm_embedding",
    "hnorm": "pre_fc_norm_hidden",
    "eh_proj": "fc",
    "final_layernorm": "norm",
}
_NEMOTRON_BLOCK = re.compile(r"^layers\.\d+\.([a-z_]+)(\..+)$")
# where the schemes that number their MTP layers among the checkpoint's put them: DeepSeek's
# after the target's (from num_hidden_layers; GLM5-next's under its text model's prefix),
# Hunyuan V4's in a list of their own
_LAYER_KEYS = {
    MtpNaming.NEXTN: re.compile(r"^model\.layers\.(\d+)\.(.+)$"),
    MtpNaming.GLM5_NEXT: re.compile(
        r"^(?:model\.language_model\.|language_model\.model\.|model\.)layers\.(\d+)\.(.+)$"
    ),
    MtpNaming.HY_V4: re.compile(r"^model\.mtp_layers\.(\d+)\.(.+)$"),
}
# DeepSeek V4's one MTP layer, its index (if any) dropped
_V4_KEY = re.compile(r"^mtp\.(?:\d+\.)?(.+)$")
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
# the schemes whose MTP layers follow the target's own decoder layers (from num_hidden_layers)
_AFTER_TARGET = (MtpNaming.NEXTN, MtpNaming.GLM5_NEXT)
# the families whose MTP layer mtp_model.py builds (the families table says)
MTP_FAMILIES = tuple(name for name, record in FAMILIES.items() if record.mtp is not None)


@dataclass(frozen=True)
class MtpNames:
    """Which of a checkpoint's weights are its MTP layers' and their names in ``MtpHead``."""

    naming: MtpNaming
    # NEXTN, GLM5_NEXT: the checkpoint's index of its first MTP layer (num_hidden_layers)
    first_layer: int
    # NEMOTRON: the MTP module's block types (mlx-lm's characters: "*" attention, "E" MoE)
    pattern: tuple[str, ...] = ()

    def split(self, key: str) -> tuple[int, str] | None:
        """``key``'s MTP layer and its name relative to that layer (Qwen's parts besides the
        decoder layers: layer 0); None: not an MTP weight."""
        if self.naming is MtpNaming.DEEPSEEK_V4:
            v4 = _V4_KEY.match(key)
            return None if v4 is None else (0, v4[1])
        if self.naming in _LAYER_KEYS:
            match = _LAYER_KEYS[self.naming].match(key)
            first = self.first_layer if self.naming in _AFTER_TARGET else 0
            if match is None or int(match[1]) < first:
                return None
            return int(match[1]) - first, match[2]
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                rest = key[len(prefix) :]
                if self.naming is MtpNaming.NEMOTRON:  # one MTP module: its blocks' names
                    return 0, rest
                if rest.startswith("layers."):
                    index, _, name = rest[len("layers.") :].partition(".")
                    if not index.isdecimal():  # not a layer of ours: the strict load says so
                        return None
                    return int(index), f"layers.0.{name}"
                return 0, rest
        return None

    def name(self, key: str) -> str | None:
        """``key`` relative to ``MtpHead`` (None: not an MTP weight, or one not read: a copy of
        the target's, or a part of a later layer than the first, which ``MtpHead`` does not
        keep). The decoder layer's weights sit under ``layers.N.``."""
        split = self.split(key)
        if split is None:
            return None
        layer, rest = split
        if self.naming is MtpNaming.DEEPSEEK_V4:  # as stored: the drafter's sanitize names it
            return rest
        if self.naming is MtpNaming.NEMOTRON:
            block = _NEMOTRON_BLOCK.match(rest)
            part = None if block is None else _NEMOTRON_PARTS.get(block[1])
            return rest if part is None or block is None else part + block[2]
        if rest.startswith("layers.0."):  # Qwen's decoder layer
            return f"layers.{layer}.{rest[len('layers.0.') :]}"
        parts = _PARTS[self.naming]
        part = next((p for p in parts if rest == p or rest.startswith(p + ".")), None)
        if part is None:  # a DeepSeek/GLM decoder layer's own weight
            return f"layers.{layer}.{rest}"
        head = parts[part]
        if head is None or layer > 0:
            return None
        return head + rest[len(part) :]

    def layer_index(self, args: Any) -> int:
        """The index the MTP layer's decoder layer is built at, which decides its class's choices
        (full attention, sparse MoE): the checkpoint's own for DeepSeek/GLM, Qwen's first
        full-attention index (every full_attention_interval-th)."""
        if self.naming is MtpNaming.NEXTN:
            return self.first_layer
        return int(getattr(args, "full_attention_interval", 1)) - 1


def mtp_names(config: dict[str, Any]) -> MtpNames:
    """The MTP names of the checkpoint whose config.json is ``config`` (a family without an MTP
    layer: Qwen's ``mtp.`` names, which no other weight has)."""
    text = config.get("text_config", config)
    naming = family(str(config.get("model_type"))).mtp or MtpNaming.QWEN
    pattern = _nemotron_pattern(text) if naming is MtpNaming.NEMOTRON else ()
    return MtpNames(naming, int(text.get("num_hidden_layers") or 0), pattern)


def _nemotron_pattern(text: dict[str, Any]) -> tuple[str, ...]:
    """A Nemotron-H config's MTP block types, as characters: ``mtp_hybrid_override_pattern``,
    else ``mtp_layers_block_type``'s names by mlx-lm's table (``()``: the config has neither)."""
    pattern = text.get("mtp_hybrid_override_pattern")
    if pattern:
        return tuple(pattern)
    names = text.get("mtp_layers_block_type") or ()
    if not names:
        return ()
    from mlx_lm.models.nemotron_h import ModelArgs

    table: dict[str, str] = ModelArgs._block_type_to_char
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise ValueError(f"the config's mtp_layers_block_type has unknown block types {unknown}")
    return tuple(table[name] for name in names)


def mtp_refusal(model_type: str) -> str | None:
    """Why a checkpoint of ``model_type`` cannot draft with MTP here (None: it can)."""
    record = family(model_type)
    if record.mtp_refusal is not None:
        return f"model type '{model_type}': {record.mtp_refusal}"
    if record.mtp is not None:
        return None
    return f"model type '{model_type}' has no MTP layer ({', '.join(MTP_FAMILIES)} do)"


# what ``--speculative auto`` drafts with on a checkpoint without MTP heads (``Engine.load``)
AUTO_WITHOUT_HEADS = (
    "--speculative auto drafts with --draft-model's drafter where one is named, else by prompt "
    "lookup where its measured break-even pays"
)


def describe_mtp_heads(path: Path) -> str:
    """What ``macbatch doctor`` says of a checkpoint's MTP heads: whether it has them and
    whether ``--speculative auto`` drafts with them."""
    model_type = str(read_config(path).get("model_type"))
    declared, stored = mtp_layer_count(path)
    if not stored:
        dropped = (
            f": the config declares {declared} MTP layer(s) but the weights were dropped "
            "(mlx-lm's convert drops them)"
            if declared
            else ""
        )
        return f"none{dropped}; {AUTO_WITHOUT_HEADS}"
    reason = mtp_refusal(model_type)
    if reason:
        return f"{stored} MTP layer(s), not used: {reason}"
    return f"{stored} MTP layer(s): --speculative auto drafts with them (docs/speculative.md)"


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


def read_config(path: Path) -> dict[str, Any]:
    """The checkpoint's config.json."""
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    return config


def mtp_layer_count(path: Path) -> tuple[int, int]:
    """(MTP layers the config declares, MTP layers whose weights the files hold)."""
    config = read_config(path)
    text = config.get("text_config", config)
    declared = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
    names = mtp_names(config)
    layers = {split[0] for key in checkpoint_headers(path) if (split := names.split(key))}
    return declared, len(layers)


def hugging_face_layout(headers: dict[str, dict[str, Any]]) -> bool:
    """Whether the checkpoint is still in Hugging Face's layout (mlx-lm's own test: a recurrent
    convolution's kernel axis last)."""
    return any("conv1d.weight" in k and v["shape"][-1] != 1 for k, v in headers.items())


def read_mtp_weights(path: Path, text: nn.Module) -> dict[str, mx.array]:
    """The MTP weights of the checkpoint at ``path`` beside its loaded text model ``text``,
    named relative to ``MtpHead`` and in MLX's layout (Qwen's norms uncentred and experts
    stacked as ``switch_mlp``; a DeepSeek/GLM layer as the target's ``sanitize`` leaves it)."""
    import mlx.core as mx

    config = read_config(path)
    names = mtp_names(config)
    headers = checkpoint_headers(path)
    files = sorted({v["file"] for k, v in headers.items() if names.name(k) is not None})
    weights: dict[str, mx.array] = {}
    for file in files:
        loaded = mx.load(str(path / file))
        assert isinstance(loaded, dict)  # a safetensors file: name -> array
        for key, value in loaded.items():
            name = names.name(key)
            if name is not None:
                weights[name] = value
    weights = dequantized_blocks(weights, config)
    if is_ue8m0_fp8(config):  # DeepSeek V4's: packed before its drafter's sanitize stacks them
        weights = as_mx_layers(weights)
    converted = _converted(weights, names.naming, headers, text)
    return as_mx_layers(converted) if is_mxfp8(config) else converted


def _converted(
    weights: dict[str, mx.array],
    naming: MtpNaming,
    headers: dict[str, dict[str, Any]],
    text: nn.Module,
) -> dict[str, mx.array]:
    """The MTP weights (float, or MLX-quantized) in MLX's layout, by the naming scheme's
    conversion."""
    if naming is MtpNaming.QWEN4:  # its norms are zero-centred in its own classes too
        return _stacked_experts(weights)
    if naming is MtpNaming.GLM5_NEXT:
        return _sanitized_by_glm5_drafter(weights, text)
    if naming is MtpNaming.DEEPSEEK_V4:
        return _sanitized_by_v4_drafter(weights, text)
    if naming is not MtpNaming.QWEN:
        return _sanitized_by_target(weights, text)
    if not hugging_face_layout(headers):
        return weights
    weights = _stacked_experts(weights)
    return {k: v + 1.0 if _is_centred_norm(k, v) else v for k, v in weights.items()}


def _sanitized_by_target(weights: dict[str, mx.array], text: nn.Module) -> dict[str, mx.array]:
    """The MTP weights through the target's own ``sanitize``, each decoder layer (block) as the
    target's layer of its index (indices its conversions cover): a Hugging Face checkpoint's
    experts stacked, DeepSeek's ``kv_b_proj`` split into ``embed_q`` / ``unembed_out``, fp8
    weights (``eh_proj`` too) dequantized; a converted layer passes unchanged. The names go in
    under the target's inner transformer (``model.``; Nemotron-H's ``backbone.``). A part
    beside the layers that the target's ``sanitize`` drops whole (Hunyuan V4's keeps only the
    names its model has: ``eh_proj`` is not one) is kept as read."""
    sanitize = getattr(text, "sanitize", None)
    if sanitize is None:
        return weights
    inner = "backbone." if hasattr(text, "backbone") else "model."
    converted = sanitize({inner + k: v for k, v in weights.items()})
    out = {k.removeprefix(inner): v for k, v in converted.items()}
    modules = {k.rsplit(".", 1)[0] for k in out}
    dropped = {
        k: v
        for k, v in weights.items()
        if not k.startswith("layers.") and k.rsplit(".", 1)[0] not in modules
    }
    return {**out, **dropped}


def _sanitized_by_glm5_drafter(
    weights: dict[str, mx.array], text: nn.Module
) -> dict[str, mx.array]:
    """GLM5-next's MTP weights through mlx-vlm's ``glm5_next_mtp`` drafter's own ``sanitize``
    (its layer named ``mtp_block.`` there; it reads the text config alone): a Hugging Face
    layer's experts stacked, ``q_a_proj`` and ``kv_a_proj_with_mqa`` fused into ``qkv_a_proj``,
    ``kv_b_proj`` split into ``embed_q`` / ``unembed_out``; a converted layer passes unchanged.
    The target's ``sanitize`` would drop the layer (an index past its own)."""
    from types import SimpleNamespace

    from mlx_vlm.speculative.drafters.glm5_next_mtp import Glm5NextMTPDraftModel

    theirs = {_renamed(k, "layers.0.", "mtp_block."): v for k, v in weights.items()}
    drafter: Any = SimpleNamespace(args=text.args)  # all its ``sanitize`` reads of itself
    converted = Glm5NextMTPDraftModel.sanitize(drafter, theirs)
    return {_renamed(k, "mtp_block.", "layers.0."): v for k, v in converted.items()}


def _sanitized_by_v4_drafter(weights: dict[str, mx.array], text: nn.Module) -> dict[str, mx.array]:
    """DeepSeek V4's MTP weights (its release's names) through mlx-vlm's ``deepseek_v4_mtp``
    drafter's own ``sanitize`` (it reads the text config alone): its block ``decoder.`` there,
    our ``layers.0.``; the other parts keep the drafter's names (``e_proj``, ``hc_head.fn`` ...),
    which ``DeepseekV4MtpHead`` has too. The target's ``sanitize`` drops ``mtp.*``."""
    from types import SimpleNamespace

    from mlx_vlm.speculative.drafters.deepseek_v4_mtp import DeepseekV4MTPDraftModel

    drafter: Any = SimpleNamespace(args=text.args)  # all its ``sanitize`` reads of itself
    converted = DeepseekV4MTPDraftModel.sanitize(drafter, weights)
    return {_renamed(k, "decoder.", "layers.0."): v for k, v in converted.items()}


def _renamed(key: str, prefix: str, replacement: str) -> str:
    return replacement + key[len(prefix) :] if key.startswith(prefix) else key


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
