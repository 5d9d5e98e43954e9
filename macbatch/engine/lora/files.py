"""An adapter's files read into one shape: per adapted layer, ``a`` ``[in, r]`` and ``b``
``[r, out]`` with the adapter's scale folded into ``b``, and DoRA's magnitude when it has one.

Two formats: mlx-lm's (``adapters.safetensors`` + ``adapter_config.json`` with
``lora_parameters``, ``num_layers`` and ``fine_tune_type``; weights named by the module's path,
``lora_a`` / ``lora_b`` / ``m``) and PEFT's (``adapter_model.safetensors`` +
``adapter_config.json`` with ``r``, ``lora_alpha``, ``target_modules``; weights under
``base_model.model.``, ``lora_A.weight`` ``[r, in]`` and ``lora_B.weight`` ``[out, r]``, the
transposes of mlx-lm's). Which layers an adapter adapts is read from its weights, the one record
of it both formats keep."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

MLX_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter that cannot be read, or does not fit its base model (the message names the
    file or the layer)."""


@dataclass(frozen=True)
class LowRank:
    """One adapted layer: ``x @ a @ b`` is added to its output (``b`` carries the scale);
    ``magnitude`` is DoRA's learned row norm (None: plain LoRA). An MoE layer's experts have one
    each: a leading axis of experts."""

    a: mx.array  # [in, r] ([E, in, r]: an MoE layer's experts)
    b: mx.array  # [r, out] ([E, r, out]), times the adapter's scale
    magnitude: mx.array | None = None  # [out]


@dataclass(frozen=True)
class AdapterFiles:
    """An adapter as read from its directory."""

    path: Path
    format: str  # "mlx-lm" or "peft"
    kind: str  # "lora" or "dora"
    rank: int
    scale: float
    layers: dict[str, LowRank]  # module path (from the text model's root) -> its low rank
    digest: str  # of the weights file: the prefix cache's scope, stable across restarts

    @property
    def nbytes(self) -> int:
        return sum(
            lr.a.nbytes + lr.b.nbytes + (0 if lr.magnitude is None else lr.magnitude.nbytes)
            for lr in self.layers.values()
        )

    @property
    def targets(self) -> list[str]:
        """The adapted projections' names (``q_proj``, ``down_proj`` ...), sorted."""
        return sorted({path.rsplit(".", 1)[-1] for path in self.layers})


def read_adapter(path: str | Path) -> AdapterFiles:
    """The adapter in directory ``path``, in whichever of the two formats it holds."""
    folder = Path(path).expanduser()
    config_file = folder / CONFIG
    if not config_file.is_file():
        raise AdapterError(f"adapter {folder}: no {CONFIG} (mlx-lm's or PEFT's)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"adapter {folder}: {CONFIG} is unreadable: {e}") from e
    if (folder / MLX_WEIGHTS).is_file():
        return _mlx_lm(folder, config)
    if (folder / PEFT_WEIGHTS).is_file():
        return _peft(folder, config)
    raise AdapterError(f"adapter {folder}: neither {MLX_WEIGHTS} nor {PEFT_WEIGHTS}")


def base_model_of(path: Path) -> str | None:
    """The base model an adapter's config names, as it was trained (mlx-lm's ``model``,
    PEFT's ``base_model_name_or_path``: a hub id or a path); None when it names none or the
    directory holds no readable adapter config."""
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    base = config.get("model") or config.get("base_model_name_or_path")
    return base if isinstance(base, str) and base else None


def _mlx_lm(folder: Path, config: dict[str, Any]) -> AdapterFiles:
    kind = config.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora"):
        raise AdapterError(f"adapter {folder}: fine_tune_type {kind!r} (lora or dora are served)")
    params = config.get("lora_parameters") or {}
    rank, scale = _required(params, "rank", folder), _required(params, "scale", folder)
    weights = _load(folder / MLX_WEIGHTS)
    layers: dict[str, LowRank] = {}
    for name in weights:
        module, _, leaf = name.rpartition(".")
        if leaf == "lora_a":
            a, b = weights[name], _weight(weights, f"{module}.lora_b", folder)
            if a.ndim == 3:  # LoRASwitchLinear's experts: [E, r, in] and [E, out, r]
                a, b = a.swapaxes(-1, -2), b.swapaxes(-1, -2)
            magnitude = weights.get(f"{module}.m") if kind == "dora" else None
            layers[_text_path(module)] = _low_rank(a, b, float(scale), magnitude)
        elif leaf not in ("lora_b", "m"):
            raise AdapterError(f"adapter {folder}: {name} is not a LoRA weight")
    return _files(folder, "mlx-lm", kind, int(rank), float(scale), layers)


def _peft(folder: Path, config: dict[str, Any]) -> AdapterFiles:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {folder}: peft_type {config['peft_type']!r} (LORA is served)")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterError(f"adapter {folder}: per-layer rank_pattern / alpha_pattern")
    rank, alpha = int(_required(config, "r", folder)), float(config.get("lora_alpha", 8))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    kind = "dora" if config.get("use_dora") else "lora"
    weights = {_peft_name(n): w for n, w in _load(folder / PEFT_WEIGHTS).items()}
    layers: dict[str, LowRank] = {}
    for name in weights:
        module, _, leaf = name.rpartition(".")
        if leaf == "lora_A":
            a = weights[name].T
            b = _weight(weights, f"{module}.lora_B", folder).T
            magnitude = weights.get(f"{module}.lora_magnitude_vector")
            layers[_text_path(module)] = _low_rank(a, b, scale, magnitude)
        elif leaf not in ("lora_B", "lora_magnitude_vector"):
            raise AdapterError(f"adapter {folder}: {name} is not a LoRA weight")
    return _files(folder, "peft", kind, rank, scale, layers)


def _peft_name(name: str) -> str:
    """A PEFT weight's name as module path + leaf (``lora_A``, ``lora_B``,
    ``lora_magnitude_vector``), the prefix and any ``.weight`` / ``.default`` dropped."""
    name = name.removeprefix(_PEFT_PREFIX)
    for tail in (".weight", ".default"):
        name = name.removesuffix(tail)
    return name


def _text_path(module: str) -> str:
    """A module path from the text model's root (a multimodal wrapper's prefix dropped)."""
    return module.removeprefix("language_model.")


def _low_rank(a: mx.array, b: mx.array, scale: float, magnitude: mx.array | None) -> LowRank:
    return LowRank(a=a, b=b * scale, magnitude=magnitude)


def _files(
    folder: Path, fmt: str, kind: str, rank: int, scale: float, layers: dict[str, LowRank]
) -> AdapterFiles:
    if not layers:
        raise AdapterError(f"adapter {folder}: no LoRA weights")
    weights = folder / (MLX_WEIGHTS if fmt == "mlx-lm" else PEFT_WEIGHTS)
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    return AdapterFiles(folder, fmt, kind, rank, scale, layers, digest)


def _load(file: Path) -> dict[str, mx.array]:
    try:
        loaded = mx.load(str(file))
    except Exception as e:  # MLX raises RuntimeError / ValueError on a bad file
        raise AdapterError(f"adapter weights {file}: {e}") from e
    assert isinstance(loaded, dict)
    return loaded


def _weight(weights: dict[str, mx.array], name: str, folder: Path) -> mx.array:
    if name not in weights:
        raise AdapterError(f"adapter {folder}: {name} is missing")
    return weights[name]


def _required(config: dict[str, Any], key: str, folder: Path) -> Any:
    if key not in config:
        raise AdapterError(f"adapter {folder}: {CONFIG} has no {key!r}")
    return config[key]
