"""Finds a model by name: the packaged demo model, a local directory, or a Hugging Face hub id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def resolve_model_path(name: str) -> Path | str:
    """A local directory for ``name``, or the hub id itself (mlx-lm downloads and caches it)."""
    if name == "demo":
        from macbatch.demo import MODEL_DIR

        if not (MODEL_DIR / "config.json").exists():
            raise ValueError(
                f"the demo model is missing from {MODEL_DIR}; rebuild it with "
                "`python scripts/train_demo_model.py`"
            )
        return MODEL_DIR
    if name == "demo-vision":  # built on this machine on first use (docs/vision.md)
        from macbatch.demo.vision import demo_vision_dir

        return demo_vision_dir()
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(f"{path} is not a model directory: it has no config.json")
        return path
    if name.startswith((".", "/", "~")):
        raise ValueError(f"no model directory at {path}")
    if name.count("/") != 1:
        raise ValueError(
            f"model '{name}' is neither a local directory nor a Hugging Face hub id "
            "(owner/name, e.g. mlx-community/Qwen3-0.6B-4bit), nor 'demo' / 'demo-vision'"
        )
    return name


def declared_head_dim(name: str) -> int | None:
    """The head dim a local model's config.json declares (None for hub ids and configs that do
    not say), so settings that depend on it fail before the weights load."""
    target = resolve_model_path(name)
    if isinstance(target, str):
        return None
    config = json.loads((target / "config.json").read_text())
    config = config.get("text_config", config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    heads = config.get("num_attention_heads")
    return int(config["hidden_size"]) // int(heads) if heads and "hidden_size" in config else None


def load_model(name: str, lazy: bool = False) -> tuple[nn.Module, TokenizerWrapper]:
    """``mlx_lm.load`` with errors a user can act on (``lazy``: weights stay unread until used,
    so a rank that keeps only its shard never holds the whole model)."""
    import mlx_lm

    from macbatch.engine.model.adapter import UnsupportedModelError
    from macbatch.engine.model.families import unsupported_reason

    target = resolve_model_path(name)
    if not isinstance(target, str):  # a local checkpoint: refuse what cannot run before loading
        model_type = str(json.loads((target / "config.json").read_text()).get("model_type"))
        reason = unsupported_reason(model_type)
        if reason:
            raise UnsupportedModelError(
                f"model '{name}' (model type '{model_type}') is not supported: {reason}"
            )
    try:
        loaded = mlx_lm.load(str(target), lazy=lazy)
    except Exception as exc:  # hub and file errors come in many types; all get the same framing
        where = "from the Hugging Face hub" if isinstance(target, str) else f"from {target}"
        raise ValueError(f"could not load model '{name}' {where}: {exc}") from exc
    return loaded[0], loaded[1]  # (a third item only when asked for the config)
