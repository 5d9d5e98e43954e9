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
    """The adapters installed in ``model`` (the text model), read from ``adapters`` (name,
    directory) and added or removed while the runner serves (``add``, ``remove``, between
    steps). An adapter keeps its slot while it is loaded (a queued request holds it); a freed
    slot is the next adapter's, and the stacks shrink when their last slots go."""

    def __init__(self, model: nn.Module, adapters: Sequence[tuple[str, str]] = ()) -> None:
        self.step = StepAdapters()
        self.refs: dict[str, AdapterRef] = {}  # ModelInfo.adapters: the same dict, kept live
        self._model = model
        self._bases = dict(model.named_modules())  # the base layers, as loaded
        self._layers: dict[str, PackedLoRALinear | PackedLoRASwitch] = {}  # wrapped, by path
        self._files: dict[int, AdapterFiles] = {}  # by slot
        read = [(name, read_adapter(path)) for name, path in adapters]
        for name, files in read:
            self._check_new(name, files)
        for name, files in read:
            self._place(name, files)
        self._install(set().union(*(f.layers for _, f in read)))

    def add(self, name: str, path: str) -> AdapterRef:
        """Read and install one more adapter (an ``AdapterError`` says why not)."""
        files = read_adapter(path)
        self._check_new(name, files)
        ref = self._place(name, files)
        self._install(set(files.layers))
        return ref

    def remove(self, name: str) -> None:
        """Uninstall an adapter no request names any more (its memory goes back)."""
        ref = self.refs.pop(name)
        files = self._files.pop(ref.slot)
        self._install(set(files.layers))

    def use(self, rows: mx.array | None) -> None:
        """The next forward's rows' slots (None: a step of the base model alone)."""
        self.step.rows = rows

    def _check_new(self, name: str, files: AdapterFiles) -> None:
        if name in self.refs:
            raise AdapterError(f"adapter {name!r} is loaded already")
        _check(name, files, self._bases)

    def _place(self, name: str, adapter: AdapterFiles) -> AdapterRef:
        """Give the adapter the lowest free slot."""
        slot = next(s for s in range(1, len(self._files) + 2) if s not in self._files)
        self._files[slot] = adapter
        ref = self.refs[name] = AdapterRef(
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
        return ref

    def _install(self, changed: set[str]) -> None:
        """Wrap the layers first adapted now, then restack every layer ``changed`` names or
        whose stacks no longer have one slot per slot in use."""
        self._wrap(sorted(changed - set(self._layers)))
        slots = max(self._files, default=0) + 1
        for path, layer in self._layers.items():
            held = None if layer.lora_a is None else layer.lora_a.shape[0]
            wanted = slots * (self._bases[path].num_experts if is_switch(self._bases[path]) else 1)
            if path in changed or (held is not None and held != wanted):
                self._stack(layer, path, slots)

    def _wrap(self, paths: list[str]) -> None:
        """Wrap ``paths`` (and, in an MoE block, its other experts' projections, so that the
        block is wrapped once, whatever a later adapter adapts of it)."""
        blocks = sorted({p.rsplit(".", 1)[0] for p in paths if is_switch(self._bases[p])})
        experts = [
            p
            for p, m in self._bases.items()
            if is_switch(m) and p.rsplit(".", 1)[0] in blocks and p not in self._layers
        ]
        wrapped = []
        for path in sorted(set(paths) | set(experts)):
            base = self._bases[path]
            switch = is_switch(base)
            layer = (
                PackedLoRASwitch(base, self.step) if switch else PackedLoRALinear(base, self.step)
            )
            self._layers[path] = layer
            wrapped.append((path, layer))
        if wrapped:
            self._model.update_modules(tree_unflatten(wrapped))
        if blocks:  # the MoE blocks whose experts are adapted tell them each index's slot
            current = dict(self._model.named_modules())
            packed = [(b, PackedExperts(current[b], self.step)) for b in blocks]
            self._model.update_modules(tree_unflatten(packed))

    def _stack(self, layer: PackedLoRALinear | PackedLoRASwitch, path: str, slots: int) -> None:
        """``layer``'s stacks: every adapter's low rank of it in its slot (zeros where an
        adapter leaves it alone, or a slot is free), padded to the largest rank (zero columns
        add nothing); an MoE block's experts get one per (slot, expert), slot-major. None when
        no adapter adapts it: the base layer alone."""
        held = {slot: f.layers[path] for slot, f in self._files.items() if path in f.layers}
        layer.lora_a = layer.lora_b = None
        if isinstance(layer, PackedLoRALinear):
            layer.dora_factor = None
        if not held:
            return
        base = self._bases[path]
        switch = is_switch(base)
        dims_in, dims_out = base_dims(base)
        quantized = hasattr(base, "scales")
        dtype = base.scales.dtype if quantized else base.weight.dtype
        rank = max(low.a.shape[-1] for low in held.values())
        experts = (base.num_experts,) if switch else ()
        a = mx.zeros((slots, *experts, dims_in, rank), dtype)
        b = mx.zeros((slots, *experts, rank, dims_out), dtype)
        factor = mx.ones((slots, dims_out), mx.float32)
        dora = False
        for slot, low in held.items():
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
