"""`macbatch doctor MODEL`: what would happen if this local model were served, before loading it.

Where it is, how it is quantized, what its chat template does and whether it reads images, and
the engine's own probe of its weights (``probe_model``: architecture, compute dtype, paged
layers, KV bytes per token, memory), the answers ``Engine.load`` would reach.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macbatch.engine import (
    describe_dflash,
    describe_eagle3,
    describe_mtp_heads,
    is_dflash_config,
    is_eagle3_config,
    probe_model,
    resolve_model_path,
    unavailable_reason,
    unsupported_reason,
)
from macbatch.models.local import describe_quantization
from macbatch.models.template_check import template_rows


@dataclass
class ModelReport:
    """What ``check_model`` found; ``problem`` is why the model cannot be served (None: it can)."""

    name: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    problem: str | None = None

    @property
    def servable(self) -> bool:
        return self.problem is None


def _drafter(config: dict[str, Any]) -> str | None:
    """What a drafter checkpoint's config says it is (None: not a drafter's)."""
    if is_dflash_config(config):
        return describe_dflash(config)
    return describe_eagle3(config) if is_eagle3_config(config) else None


def check_model(name: str, self_check: bool = False) -> ModelReport:
    """``self_check``: also load the model and run the engine's self-check (its result and
    time, beside the load's)."""
    from macbatch.engine import encoder_facts

    report = ModelReport(name)
    try:
        path = _local_path(name)
        report.rows.append(("path", str(path)))
        config = json.loads((path / "config.json").read_text())
        report.rows.append(("quantization", describe_quantization(config)))
        drafter = _drafter(config)
        if drafter:  # a drafter, not a model to serve: nothing to probe
            report.rows.append(("drafter", drafter))
            return report
        reason = unsupported_reason(str(config.get("model_type")), config.get("architectures"))
        encoder = encoder_facts(path)
        if encoder is not None:  # its own engine serves it; the decoder's probe has no say
            report.rows.append(("encoder", f"{','.join(encoder.tasks)}: {encoder.describe()}"))
            return report
        if reason:
            report.problem = f"model type '{config.get('model_type')}' is not supported: {reason}"
            return report
        report.problem = probe_model(path, report.rows)
        report.rows.extend(template_rows(path))
        no_images = unavailable_reason(path, name)
        report.rows.append(
            ("images", "yes (docs/vision.md)" if no_images is None else f"no: {no_images}")
        )
        report.rows.append(("MTP heads", describe_mtp_heads(path)))
        if self_check and report.problem is None:
            report.problem = _self_check(name, report.rows)
    except (ValueError, OSError) as exc:
        report.problem = str(exc)
    return report


def _self_check(name: str, rows: list[tuple[str, str]]) -> str | None:
    """Load the model as serving it would and append the self-check's row; why it is refused
    (None: it passed)."""
    import time

    from macbatch.engine import Engine, EngineConfig

    started = time.perf_counter()
    try:
        engine = Engine.load(name, EngineConfig(self_check=True))
    except ValueError as exc:  # the check's refusal (UnsupportedModelError) or a load error
        rows.append(("self-check", "failed"))
        return str(exc)
    check = engine.self_check
    assert check is not None
    load_s = time.perf_counter() - started - check.seconds
    engine.close()
    rows.append(("self-check", f"{check.describe()}; the load took {load_s:.2f} s"))
    return None


def _local_path(name: str) -> Path:
    """The model's directory here; a hub id must already be in the Hugging Face cache."""
    target = resolve_model_path(name)
    if isinstance(target, Path):
        return target
    from macbatch.models.local import local_models

    for model in local_models():
        if model.name == target:
            return model.path
    raise ValueError(
        f"'{name}' is not downloaded yet; `macbatch chat -m {name}` (or run/serve) downloads it"
    )
