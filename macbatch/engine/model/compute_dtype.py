"""The dtype the engine computes in, why, and whether the weights fit in it.

MLX's CPU backend runs matmuls through BLAS only in float32 (half types take a slow path), so a
model the engine loaded itself is cast to float32 there. A model the caller built or loaded is
never cast behind their back: it keeps its dtype unless ``EngineConfig.dtype`` asks for another.
Before any cast, the extra memory it needs is compared with what the machine has free; a cast
that would not fit is refused with the numbers and the ways out.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

log = logging.getLogger(__name__)
_CPU_DTYPE = "float32"


@dataclass(frozen=True)
class ComputeDtype:
    """The floating dtype of the weights the engine runs, and why it is that one."""

    dtype: str
    reason: str


def available_memory_bytes() -> int:
    """Memory free for new allocations now (unified memory on a Mac: the same pool). macOS has
    no count of free pages in sysconf (a glibc extension): there, all of physical memory."""
    pages = "SC_AVPHYS_PAGES" if "SC_AVPHYS_PAGES" in os.sysconf_names else "SC_PHYS_PAGES"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf(pages)


def parameter_arrays(model: nn.Module) -> list[mx.array]:
    """Every parameter array of ``model``."""
    flat = tree_flatten(model.parameters())
    assert isinstance(flat, list)  # a dict only when given one to fill
    return [array for _, array in flat]


def _float_dtype(model: nn.Module) -> str | None:
    for value in parameter_arrays(model):
        if mx.issubdtype(value.dtype, mx.floating):
            return str(value.dtype).removeprefix("mlx.core.")
    return None


def cast_bytes(model: nn.Module, dtype: str) -> int:
    """Extra bytes the float weights take once cast to ``dtype`` (negative when they shrink)."""
    size = getattr(mx, dtype).size
    return sum(
        value.size * size - value.nbytes
        for value in parameter_arrays(model)
        if mx.issubdtype(value.dtype, mx.floating)
    )


def settle_compute_dtype(model: nn.Module, requested: str | None, owns_model: bool) -> ComputeDtype:
    """Cast ``model`` in place when asked (``requested``) or when the engine owns it on the CPU
    backend; ``ValueError`` when the cast would not fit in free memory."""
    current = _float_dtype(model) or _CPU_DTYPE
    on_cpu = mx.default_device() == mx.cpu
    if requested is not None:
        target, why = requested, f"EngineConfig.dtype asks for {requested}"
    elif on_cpu and owns_model:
        target = _CPU_DTYPE
        why = f"MLX's CPU backend runs matmuls fast (through BLAS) only in {_CPU_DTYPE}"
    elif on_cpu and current != _CPU_DTYPE:
        return _chosen(
            current,
            f"the caller's {current} model is not cast in place; MLX's CPU backend runs half "
            f"precision matmuls slowly: pass EngineConfig(dtype='{_CPU_DTYPE}') to cast it",
        )
    else:
        return _chosen(current, "the model's own dtype")
    if target == current:
        return _chosen(current, why)
    extra = cast_bytes(model, target)
    free = available_memory_bytes()
    if extra > free:
        raise ValueError(
            f"casting the {current} weights to {target} ({why}) needs {extra / 2**30:.1f} GiB "
            f"more memory and {free / 2**30:.1f} GiB is free; use a quantized model, free "
            f"memory, or set EngineConfig(dtype='{current}') to run as is"
        )
    model.set_dtype(getattr(mx, target))
    return _chosen(target, f"{why}; cast from {current}")


def _chosen(dtype: str, reason: str) -> ComputeDtype:
    log.info("compute dtype %s: %s", dtype, reason)
    return ComputeDtype(dtype, reason)
