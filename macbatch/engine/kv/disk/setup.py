"""Building an engine's disk tier: its namespace, its byte cap, its directory proven writable
(``open_disk_tier``: None, with one warning, when it is not)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.engine.kv.disk.cap import default_cap_bytes
from macbatch.engine.kv.disk.files import BlockFiles
from macbatch.engine.kv.disk.namespace import Namespace, weights_fingerprint
from macbatch.engine.kv.disk.tier import DiskTier
from macbatch.engine.kv.group import DiskPart
from macbatch.engine.stores.held_bytes import FORMAT, layout
from macbatch.engine.stores.held_caches import HeldCaches

if TYPE_CHECKING:
    from macbatch.engine.model.adapter import ModelAdapter
    from macbatch.engine.stores.pages import KVStore
    from macbatch.engine.stores.state_store import StateStore

log = logging.getLogger("macbatch.disk_cache")

MAX_QUEUED_BYTES = 1 * 2**30  # captured blocks waiting for the writer, at most
# blocks read ahead for requests not scheduled yet, at most: this fraction of the pool's cap
READ_AHEAD_FRACTION = 0.25


def namespace_of(
    adapter: ModelAdapter,
    store: KVStore,
    window: KVStore | None,
    states: StateStore | None,
    model_name: str,
    prefix_root: bytes,
) -> Namespace:
    """Everything the bytes on disk of a model's cache groups depend on: the runner's full
    group's pages (``store``), its window group's and its recurrent states (None: none)."""
    return Namespace(
        model=model_name,
        model_type=adapter.model_type,
        weights=weights_fingerprint(adapter.model, model_name),
        dtype=str(store.format.dtype),
        kv_bits=store.format.bits,
        kv_group_sizes=_group_sizes(store),
        block_size=store.block_size,
        layers=_shapes(store),
        prefix_root=prefix_root.decode(errors="replace"),
        window=None if window is None else adapter.window,
        window_layers=() if window is None else _shapes(window),
        layer_slots=tuple(adapter.kv_slots),
        states=() if states is None else _state_layout(states),
        indexer_keys=store.format.indexer_keys if _has_indexer_keys(store) else None,
        held=_held_layout(states),
    )


def _held_layout(states: StateStore | None) -> tuple[str, ...]:
    """Held caches' payload format and classes (``held_bytes.layout``; none: not held)."""
    if not isinstance(states, HeldCaches) or states.new_caches is None:
        return ()
    return (FORMAT, *layout(states.new_caches()))


def _shapes(store: KVStore) -> tuple[tuple[int, int], ...]:
    return tuple((s.num_kv_heads, s.head_dim) for s in store.shapes)


def _has_indexer_keys(store: KVStore) -> bool:
    return any(s.indexer_keys for s in store.shapes)


def _group_sizes(store: KVStore) -> tuple[int, ...]:
    fmt = store.format
    return tuple(fmt.group_size_for(s.head_dim) for s in store.shapes) if fmt.bits else ()


def _state_layout(states: StateStore) -> tuple[str, ...]:
    return tuple(
        f"{shape} {dtype}"
        for layer in states.layers
        for shape, dtype in zip(layer.shapes, layer.dtypes)
    )


def open_disk_tier(
    directory: str,
    cap_bytes: int | None,
    namespace: Namespace,
    parts: list[DiskPart],
    pool_cap_bytes: int,
) -> DiskTier | None:
    """The tier over ``directory`` keeping ``parts`` (every cache group's; None, with one
    warning, when it cannot be written: the engine serves from RAM alone). ``pool_cap_bytes``:
    the full group's pool at its cap, which bounds the blocks read ahead."""
    root = Path(directory).expanduser()
    cap = default_cap_bytes(root, None) if cap_bytes is None else cap_bytes
    files = BlockFiles(root, namespace.key, cap, namespace.record())
    try:
        files.open()
    except OSError as error:
        log.warning(
            "disk KV cache off: %s is not writable (%s); serving from RAM only", root, error
        )
        return None
    read_ahead = int(pool_cap_bytes * READ_AHEAD_FRACTION)
    return DiskTier(files, parts, MAX_QUEUED_BYTES, read_ahead)
