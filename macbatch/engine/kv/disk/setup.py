"""Building an engine's disk tier: its namespace, its byte cap, its directory proven writable
(``open_disk_tier``: None, with one warning, when it is not)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import mlx.nn as nn

from macbatch.engine.kv.disk.files import BlockFiles
from macbatch.engine.kv.disk.namespace import Namespace, weights_fingerprint
from macbatch.engine.kv.disk.tier import BlockPages, DiskTier, Names
from macbatch.engine.worker.pages import KVStore

log = logging.getLogger("macbatch.disk_cache")

DEFAULT_CAP_BYTES = 20 * 2**30
MAX_QUEUED_BYTES = 1 * 2**30  # captured blocks waiting for the writer, at most


def default_cap_bytes(directory: Path) -> int:
    """20 GiB or a tenth of the free space, whichever is smaller."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return DEFAULT_CAP_BYTES
    return min(DEFAULT_CAP_BYTES, free // 10)


def namespace_of(
    model: nn.Module, model_name: str, model_type: str, store: KVStore, prefix_root: bytes
) -> Namespace:
    fmt = store.format
    bits = fmt.bits
    groups = tuple(fmt.group_size_for(s.head_dim) for s in store.shapes) if bits else ()
    return Namespace(
        model=model_name,
        model_type=model_type,
        weights=weights_fingerprint(model, model_name),
        dtype=str(fmt.dtype),
        kv_bits=bits,
        kv_group_sizes=groups,
        block_size=store.block_size,
        layers=tuple((s.num_kv_heads, s.head_dim) for s in store.shapes),
        prefix_root=prefix_root.decode(errors="replace"),
    )


def open_disk_tier(
    directory: str,
    cap_bytes: int | None,
    namespace: Namespace,
    pages: BlockPages,
    names: Names,
) -> DiskTier | None:
    """The tier over ``directory`` (None, with one warning, when it cannot be written: the
    engine serves from RAM alone)."""
    root = Path(directory).expanduser()
    cap = default_cap_bytes(root) if cap_bytes is None else cap_bytes
    files = BlockFiles(root, namespace.key, cap)
    try:
        files.open()
        namespace.describe(files.directory)
    except OSError as error:
        log.warning(
            "disk KV cache off: %s is not writable (%s); serving from RAM only", root, error
        )
        return None
    return DiskTier(files, pages, names, MAX_QUEUED_BYTES)
