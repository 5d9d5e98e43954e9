"""A drafter checkpoint's files (DFlash, Eagle-3): where it is, its config and its safetensors,
and its weights loaded into the module built for it, as each such checkpoint stores them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import mlx.nn as nn

Module = TypeVar("Module", bound=nn.Module)


def checkpoint_dir(path: str | Path) -> Path:
    """A drafter checkpoint's directory: ``path``, or a hub id's snapshot (its configs and
    safetensors)."""
    root = Path(path)
    if root.is_dir():
        return root
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))


def read_checkpoint(path: str | Path, kind: str) -> tuple[dict[str, Any], dict[str, mx.array]]:
    """The config and the weights of the ``kind`` drafter checkpoint at ``path`` (a local
    directory or a hub id), a ``model.`` prefix some keep dropped. Only safetensors are read:
    ``ValueError`` where there are none (a ``pytorch_model.bin``, as some are published)."""
    root = checkpoint_dir(path)
    raw = json.loads((root / "config.json").read_text())
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"the {kind} checkpoint at {root} has no safetensors (a pytorch_model.bin is not "
            "read here: convert it to model.safetensors beside its config.json)"
        )
    weights: dict[str, mx.array] = {}
    for file in files:
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    return raw, {k.removeprefix("model."): v for k, v in weights.items()}


def input_width(weights: dict[str, mx.array], layer: str, raw: dict[str, Any]) -> int:
    """The inputs of the linear ``layer`` as stored: a quantized one's packed weight holds
    ``32 / bits`` of them per element."""
    width = int(weights[f"{layer}.weight"].shape[1])
    quantization = raw.get("quantization")
    if quantization and f"{layer}.scales" in weights:
        width = width * 32 // int(quantization["bits"])
    return width


def load_into(model: Module, weights: dict[str, mx.array], raw: dict[str, Any]) -> Module:
    """``model`` with ``weights``: an ``embed_tokens`` of its own where they hold one (else it
    uses the target's), quantized first where the config ``raw`` says it was."""
    if "embed_tokens.weight" in weights:
        vocab, dim = weights["embed_tokens.weight"].shape
        model.embed_tokens = nn.Embedding(vocab, dim)
    quantization = raw.get("quantization")
    if quantization:
        nn.quantize(model, quantization["group_size"], quantization["bits"])
    model.load_weights(list(weights.items()))
    return model


def read_local_config(path: str) -> dict[str, Any] | None:
    """A local checkpoint's config (None: not local: a hub id is read when loaded)."""
    config = Path(path) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else None
