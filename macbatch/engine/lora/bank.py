"""The adapters one runner holds: read, checked against the base model's layers, and installed
as one ``PackedLoRALinear`` per adapted layer, stacked by slot (slot 0: the base model), the
``A`` of projections that read the same input stacked together (``SharedInput``).

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
    base_dims,
    base_weight,
    is_switch,
)
from macbatch.engine.lora.shared_input import SharedInput, StepAdapters, group_key


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
        self._groups: dict[str, tuple[SharedInput, list[str]]] = {}  # by key: wrapped paths
        self._files: dict[int, AdapterFiles] = {}  # by slot
        self._slots = 1  # the slots the stacks hold (0 and every adapter's)
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
        self.step.use(rows, self._slots - 1)

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
        """Wrap the layers first adapted now, then restack every layer ``changed`` names (every
        layer, when the number of slots changed)."""
        self._wrap(sorted(changed - set(self._layers)))
        slots = max(self._files, default=0) + 1
        if slots != self._slots:
            changed, self._slots = set(self._layers), slots
        for path in sorted(changed):
            layer = self._layers[path]
            if isinstance(layer, PackedLoRASwitch):
                self._stack_experts(layer, path)
        for key in sorted({self._group_of(p) for p in changed if not is_switch(self._bases[p])}):
            self._stack_group(*self._groups[key])

    def _group_of(self, path: str) -> str:
        return group_key(path, base_dims(self._bases[path])[0])

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
            layer: PackedLoRALinear | PackedLoRASwitch
            if is_switch(base):
                layer = PackedLoRASwitch(base, self.step)
            else:
                key = self._group_of(path)
                shared, members = self._groups.setdefault(key, (SharedInput(self.step), []))
                members.append(path)
                layer = PackedLoRALinear(base, shared)
            self._layers[path] = layer
            wrapped.append((path, layer))
        if wrapped:
            self._model.update_modules(tree_unflatten(wrapped))
        if blocks:  # the MoE blocks whose experts are adapted tell them each index's slot
            current = dict(self._model.named_modules())
            packed = [(b, PackedExperts(current[b], self.step)) for b in blocks]
            self._model.update_modules(tree_unflatten(packed))

    def _held(self, path: str) -> dict[int, LowRank]:
        """Each adapter's low rank of ``path``, by slot (those that adapt it)."""
        return {slot: f.layers[path] for slot, f in self._files.items() if path in f.layers}

    def _stack_group(self, shared: SharedInput, paths: list[str]) -> None:
        """A group's stacks: its members' ``A`` side by side in ``shared``, each member's ``B``
        in its layer, every adapter in its column (slot - 1; zeros where an adapter leaves a
        member alone), ranks padded to the group's largest (zero columns add nothing). A
        member no adapter adapts has none: its base layer alone."""
        held = {path: self._held(path) for path in paths}
        active = [path for path in paths if held[path]]
        for path in paths:
            layer = self._layers[path]
            assert isinstance(layer, PackedLoRALinear)
            layer.member = layer.lora_b = layer.dora_factor = None
        shared.lora_a = None
        if not active:
            return
        dims_in = base_dims(self._bases[active[0]])[0]
        dtype = _dtype(self._bases[active[0]])
        rank = max(low.a.shape[-1] for path in active for low in held[path].values())
        columns = self._slots - 1
        a = mx.zeros((dims_in, len(active), columns, rank), dtype)
        for member, path in enumerate(active):
            base = self._bases[path]
            b = mx.zeros((columns, rank, base_dims(base)[1]), dtype)
            factor = mx.ones((self._slots, b.shape[-1]), mx.float32)
            for slot, low in held[path].items():
                r = low.a.shape[-1]
                a[:, member, slot - 1, :r] = low.a.astype(dtype)
                b[slot - 1, :r, :] = low.b.astype(dtype)
                if low.magnitude is not None:
                    factor[slot] = _dora_factor(base, low)
            layer = self._layers[path]
            assert isinstance(layer, PackedLoRALinear)
            layer.member, layer.lora_b = member, b
            dora = any(low.magnitude is not None for low in held[path].values())
            layer.dora_factor = factor if dora else None
        shared.lora_a = a
        mx.eval(a, [self._layers[path].parameters() for path in active])

    def _stack_experts(self, layer: PackedLoRASwitch, path: str) -> None:
        """An MoE block's experts' stacks: one low rank per (slot, expert), slot-major, as
        ``gather_mm`` indexes them (zeros where an adapter leaves them alone, or a slot is
        free), padded to the largest rank. None when no adapter adapts them."""
        held = self._held(path)
        layer.lora_a = layer.lora_b = None
        if not held:
            return
        base = self._bases[path]
        dims_in, dims_out = base_dims(base)
        dtype = _dtype(base)
        rank = max(low.a.shape[-1] for low in held.values())
        shape = (self._slots, base.num_experts)
        a = mx.zeros((*shape, dims_in, rank), dtype)
        b = mx.zeros((*shape, rank, dims_out), dtype)
        for slot, low in held.items():
            r = low.a.shape[-1]
            a[slot, ..., :r] = low.a.astype(dtype)
            b[slot, ..., :r, :] = low.b.astype(dtype)
        layer.lora_a, layer.lora_b = a.reshape(-1, dims_in, rank), b.reshape(-1, rank, dims_out)
        mx.eval(layer.parameters())


def _dtype(base: nn.Module) -> mx.Dtype:
    """The dtype a base layer computes in (a quantized one's: its scales')."""
    return base.scales.dtype if hasattr(base, "scales") else base.weight.dtype


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
