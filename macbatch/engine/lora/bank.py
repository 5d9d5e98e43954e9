"""The adapters one runner holds: read, checked against the base model's layers, and installed
as one ``PackedLoRALinear`` per adapted layer, stacked by slot (slot 0: the base model).

What a request needs of its adapter (its slot, its prefix-cache scope) and what the front ends
show of it (rank, targets, bytes) is an ``AdapterRef``, read from ``ModelInfo.adapters``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from macbatch.engine.lora.files import AdapterError, AdapterFiles, LowRank, read_adapter
from macbatch.engine.lora.layers import (
    PackedExperts,
    PackedLoRALinear,
    PackedLoRASwitch,
    StepAdapters,
    base_dims,
    base_weight,
    is_switch,
)


@dataclass(frozen=True)
class AdapterRef:
    """A loaded adapter as requests and front ends see it."""

    name: str
    slot: int  # its index in every adapted layer's stacks (0 is the base model)
    path: str
    format: str  # "mlx-lm" or "peft"
    kind: str  # "lora" or "dora"
    rank: int
    targets: tuple[str, ...]  # the adapted projections' names
    num_layers: int  # adapted linear layers
    nbytes: int
    digest: str  # of its weights file

    @property
    def cache_scope(self) -> bytes:
        """What the prefix cache's chain starts from beside the model's root: an adapter
        changes every K/V after its first adapted layer, so its blocks are its own (by content:
        a file changed under the same name never meets its old blocks, on disk either)."""
        return f"|lora:{self.name}:{self.digest}".encode()


class AdapterBank:
    """Reads ``adapters`` (name, directory) and installs them into ``model`` (the text model)."""

    def __init__(self, model: nn.Module, adapters: Sequence[tuple[str, str]]) -> None:
        self.step = StepAdapters()
        files = [read_adapter(path) for _, path in adapters]
        modules = dict(model.named_modules())
        for (name, _), adapter in zip(adapters, files):
            _check(name, adapter, modules)
        paths = sorted({p for adapter in files for p in adapter.layers})
        wrapped = [(p, self._wrap(modules[p], p, files)) for p in paths]
        if wrapped:
            model.update_modules(tree_unflatten(wrapped))
        # the MoE blocks whose experts are adapted tell them each index's slot
        blocks = sorted({p.rsplit(".", 1)[0] for p in paths if is_switch(modules[p])})
        if blocks:
            current = dict(model.named_modules())
            experts = [(b, PackedExperts(current[b], self.step)) for b in blocks]
            model.update_modules(tree_unflatten(experts))
        self.refs = {
            name: AdapterRef(
                name=name,
                slot=slot,
                path=str(adapter.path),
                format=adapter.format,
                kind=adapter.kind,
                rank=adapter.rank,
                targets=tuple(adapter.targets),
                num_layers=len(adapter.layers),
                nbytes=adapter.nbytes,
                digest=adapter.digest,
            )
            for slot, ((name, _), adapter) in enumerate(zip(adapters, files), start=1)
        }

    def use(self, rows: mx.array | None) -> None:
        """The next forward's rows' slots (None: a step of the base model alone)."""
        self.step.rows = rows

    def _wrap(
        self, base: nn.Module, path: str, files: list[AdapterFiles]
    ) -> PackedLoRALinear | PackedLoRASwitch:
        """``base`` wrapped, with every adapter's low rank of it in its slot (zeros where an
        adapter leaves it alone), padded to the largest rank (zero columns add nothing); an MoE
        block's experts get one per (slot, expert), slot-major."""
        switch = is_switch(base)
        layer = PackedLoRASwitch(base, self.step) if switch else PackedLoRALinear(base, self.step)
        dims_in, dims_out = base_dims(base)
        quantized = hasattr(base, "scales")
        dtype = base.scales.dtype if quantized else base.weight.dtype
        rank = max(f.layers[path].a.shape[-1] for f in files if path in f.layers)
        experts = (base.num_experts,) if switch else ()
        slots = len(files) + 1
        a = mx.zeros((slots, *experts, dims_in, rank), dtype)
        b = mx.zeros((slots, *experts, rank, dims_out), dtype)
        factor = mx.ones((slots, dims_out), mx.float32)
        dora = False
        for slot, adapter in enumerate(files, start=1):
            low = adapter.layers.get(path)
            if low is None:
                continue
            r = low.a.shape[-1]
            a[slot, ..., :r] = low.a.astype(dtype)
            b[slot, ..., :r, :] = low.b.astype(dtype)
            if low.magnitude is not None:
                factor[slot] = _dora_factor(base, low)
                dora = True
        if switch:  # (slot, expert) pairs on one axis, as gather_mm indexes them
            a, b = a.reshape(-1, dims_in, rank), b.reshape(-1, rank, dims_out)
        layer.lora_a, layer.lora_b = a, b
        if dora and isinstance(layer, PackedLoRALinear):
            layer.dora_factor = factor
        mx.eval(layer.parameters())
        return layer


def _dora_factor(base: nn.Module, low: LowRank) -> mx.array:
    """DoRA's per-output-row factor: the learned magnitude over the adapted weight's row norm
    (fixed once the adapter is trained, so computed once here, as mlx-lm's fuse does)."""
    assert low.magnitude is not None
    weight = base_weight(base).astype(mx.float32)
    adapted = weight + (low.b.T @ low.a.T).astype(mx.float32)
    return low.magnitude.astype(mx.float32) / mx.linalg.norm(adapted, axis=1)


def _check(name: str, adapter: AdapterFiles, modules: dict[str, nn.Module]) -> None:
    """Each adapted layer exists in the base model, is a linear layer, and its shapes match."""
    for path, low in adapter.layers.items():
        module = modules.get(path)
        where = f"adapter '{name}' ({adapter.path}), layer {path}"
        if module is None:
            raise AdapterError(f"{where}: the base model has no such layer")
        if ".layers." not in f".{path}":  # the LM head sees the sampled rows only, not every row
            raise AdapterError(f"{where}: outside the decoder layers (not served yet)")
        switch = is_switch(module)
        if not switch and not isinstance(module, (nn.Linear, nn.QuantizedLinear)):
            raise AdapterError(
                f"{where}: a {type(module).__name__}; adapters of linear layers and MoE experts "
                "are served (not of embeddings yet)"
            )
        if switch and low.magnitude is not None:
            raise AdapterError(f"{where}: DoRA of MoE experts (mlx-lm has none either)")
        dims_in, dims_out = base_dims(module)
        ndim = 3 if switch else 2
        if low.a.ndim != ndim or low.b.ndim != ndim or low.a.shape[-1] != low.b.shape[-2]:
            raise AdapterError(f"{where}: lora_a {low.a.shape} and lora_b {low.b.shape}")
        if switch and low.a.shape[0] != module.num_experts:
            raise AdapterError(
                f"{where}: the adapter has {low.a.shape[0]} experts, the base layer "
                f"{module.num_experts}"
            )
        if (low.a.shape[-2], low.b.shape[-1]) != (dims_in, dims_out):
            raise AdapterError(
                f"{where}: the adapter maps {low.a.shape[-2]} -> {low.b.shape[-1]} features, "
                f"the base layer {dims_in} -> {dims_out} (an adapter of another model?)"
            )
