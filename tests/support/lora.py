"""Random adapters made by mlx-lm's own tuner, saved in mlx-lm's format (and converted to
PEFT's), and mlx-lm's own model with an adapter loaded: the oracle of the LoRA tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters

from tests.support.tiny import build_model

ATTENTION = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
_LEAVES = ("lora_a", "lora_b", "m")


def base_model(arch: str, quantized: bool) -> nn.Module:
    """The tiny base model, 4-bit (groups of 32) when ``quantized``: built the same every call."""
    model = build_model(arch)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
    return model


def save_adapter(
    path: Path,
    arch: str = "qwen3",
    *,
    seed: int,
    keys: list[str] | None = None,
    rank: int = 4,
    scale: float = 2.0,
    num_layers: int = 2,
    dora: bool = False,
    model: nn.Module | None = None,
) -> Path:
    """An adapter of ``arch`` trained by nobody: mlx-lm's LoRA (or DoRA) layers on its
    ``keys`` (None: every linear layer, mlx-lm's default) of the last ``num_layers`` layers,
    ``lora_b`` (and DoRA's magnitude) random and non-zero, saved as ``mlx_lm.lora`` saves
    (``model``: a fresh base model of another shape to adapt instead of the tiny ``arch``)."""
    model = model if model is not None else build_model(arch)
    params = {"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys}
    linear_to_lora_layers(model, num_layers, params, use_dora=dora)
    mx.random.seed(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_a", "lora_b"):  # lora_b is zeros as built: an adapter changing nothing
            value = mx.random.normal(value.shape) * 0.2
        elif leaf == "m":
            value = value * (1.0 + 0.2 * mx.random.uniform(shape=value.shape))
        if leaf in _LEAVES:
            weights[name] = value
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "adapters.safetensors"), weights)
    config = {
        "fine_tune_type": "dora" if dora else "lora",
        "num_layers": num_layers,
        "lora_parameters": params,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def adapted_model(arch: str, adapter: Path | None, quantized: bool = False) -> nn.Module:
    """mlx-lm's own model with ``adapter`` loaded by its ``load_adapters`` (None: the base)."""
    model = base_model(arch, quantized)
    if adapter is not None:
        load_adapters(model, str(adapter))
        mx.eval(model.parameters())
    return model


def to_peft(mlx_adapter: Path, path: Path) -> Path:
    """The same adapter in PEFT's layout: ``base_model.model.`` names, ``lora_A`` / ``lora_B``
    transposed, ``lora_alpha`` giving the same scale."""
    config = json.loads((mlx_adapter / "adapter_config.json").read_text())
    params = config["lora_parameters"]
    loaded = mx.load(str(mlx_adapter / "adapters.safetensors"))
    assert isinstance(loaded, dict)
    peft: dict[str, Any] = {}
    targets = set()
    for name, value in loaded.items():
        module, leaf = name.rsplit(".", 1)
        targets.add(module.rsplit(".", 1)[-1])
        renamed = {"lora_a": "lora_A", "lora_b": "lora_B"}[leaf]
        peft[f"base_model.model.{module}.{renamed}.weight"] = value.T
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "adapter_model.safetensors"), peft)
    peft_config = {
        "peft_type": "LORA",
        "r": params["rank"],
        "lora_alpha": params["scale"] * params["rank"],
        "target_modules": sorted(targets),
        "lora_dropout": 0.0,
    }
    (path / "adapter_config.json").write_text(json.dumps(peft_config))
    return path


def name_base(adapter: Path, base: str) -> Path:
    """Write the base model into the adapter's config, where its format keeps it (mlx-lm's
    ``model``, PEFT's ``base_model_name_or_path``), as their trainers write it."""
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path" if "peft_type" in config else "model"] = base
    config_file.write_text(json.dumps(config))
    return adapter
