"""`macbatch doctor MODEL`: what would happen if this local model were served, before loading it.

The weights are opened lazily (memory-mapped, never read) and the engine's own adapter probes the
model's graph without evaluating it, so the answers (architecture, paged layers, KV bytes per
token, compute dtype) are the ones ``Engine.load`` would reach, at the cost of a config read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlx.utils import tree_reduce

from macbatch.engine.loader import resolve_model_path
from macbatch.engine.model.adapter import (
    ModelAdapter,
    model_type_of,
    text_model,
    unsupported_reason,
)
from macbatch.engine.multimodal.vision import unavailable_reason
from macbatch.engine.worker.compute_dtype import available_memory_bytes, settle_compute_dtype
from macbatch.engine.worker.pages import PageFormat
from macbatch.models import describe_quantization
from macbatch.template_check import template_rows


@dataclass
class ModelReport:
    """What ``check_model`` found; ``problem`` is why the model cannot be served (None: it can)."""

    name: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    problem: str | None = None

    @property
    def servable(self) -> bool:
        return self.problem is None


def check_model(name: str) -> ModelReport:
    report = ModelReport(name)
    try:
        path = _local_path(name)
        report.rows.append(("path", str(path)))
        config = json.loads((path / "config.json").read_text())
        report.rows.append(("quantization", describe_quantization(config)))
        reason = unsupported_reason(str(config.get("model_type")))
        if reason:
            report.problem = f"model type '{config.get('model_type')}' is not supported: {reason}"
            return report
        _probe(path, report)
        report.rows.extend(template_rows(path))
        no_images = unavailable_reason(path, name)
        report.rows.append(
            ("images", "yes (docs/vision.md)" if no_images is None else f"no: {no_images}")
        )
    except (ValueError, OSError) as exc:
        report.problem = str(exc)
    return report


def _local_path(name: str) -> Path:
    """The model's directory here; a hub id must already be in the Hugging Face cache."""
    target = resolve_model_path(name)
    if isinstance(target, Path):
        return target
    from macbatch.models import local_models

    for model in local_models():
        if model.name == target:
            return model.path
    raise ValueError(
        f"'{name}' is not downloaded yet; `macbatch chat -m {name}` (or run/serve) downloads it"
    )


def _probe(path: Path, report: ModelReport) -> None:
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(path, lazy=True)
    except Exception as exc:  # an unknown model_type, missing weights ...: all mean "cannot load"
        raise ValueError(f"mlx-lm cannot load it: {exc}") from exc
    outer_type = model_type_of(model)
    inner_type = model_type_of(text_model(model))
    shown = outer_type if inner_type == outer_type else f"{outer_type} (text model: {inner_type})"
    report.rows.append(("architecture", shown))
    try:
        dtype = settle_compute_dtype(model, None, owns_model=True)
    except ValueError as exc:
        report.problem = str(exc)
        return
    report.rows.append(("compute dtype", f"{dtype.dtype} ({dtype.reason})"))
    try:
        adapter = ModelAdapter(model)  # UnsupportedModelError (a ValueError) says why not
    except Exception as exc:  # an architecture whose forward fails on the probe: same answer
        raise ValueError(f"the paged engine cannot run it: {exc}") from exc
    attention, paged = len(adapter.kv_layers), len(adapter.layer_shapes)
    shared = f", {attention - paged} reuse another layer's K/V" if paged < attention else ""
    recurrent = len(adapter.state_shapes)
    both = sum(len(entry) > 1 for entry in adapter.recurrent)  # attention and state side by side
    kinds = f"{paged} with KV pages{shared}"
    if recurrent:
        kinds += f", {recurrent} recurrent"
    if both:
        kinds += f"; {both} run both side by side"
    report.rows.append(("layers", f"{attention + recurrent - both} ({kinds})"))
    per_token = PageFormat(adapter.kv_dtype).bytes_per_block(adapter.layer_shapes, 1)
    kv_dtype = str(adapter.kv_dtype).removeprefix("mlx.core.")
    report.rows.append(("KV bytes/token", f"{per_token:,} ({kv_dtype})"))
    if recurrent:
        state = sum(s.nbytes for s in adapter.state_shapes)
        report.rows.append(("state bytes/request", f"{state:,} (recurrent layers, fixed size)"))
    # what the weights take once loaded and cast (lazy arrays know their size unread)
    needed = tree_reduce(lambda total, array: total + array.nbytes, model.parameters(), 0)
    free = available_memory_bytes()
    report.rows.append(("memory", f"{_size(needed)} of weights, {_size(free)} free"))
    if needed > free:
        report.problem = (
            f"its weights need {_size(needed)} and {_size(free)} is free; "
            "free memory or pick a smaller (quantized) model"
        )


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"
