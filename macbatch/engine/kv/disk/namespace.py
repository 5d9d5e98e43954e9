"""A model's namespace in the disk tier: the directory whose blocks only the same weights, page
format, block size and layer shapes may read (every cache group's: a sliding window's size and
layers, a hybrid's state layout, held library caches' format and classes; a draft model's pages are
not kept, so a draft changes none). Its name is a hash of all of that and the files' format
version, so a different model, a different ``kv_bits`` or group size, fp8 indexer keys or not,
another dtype or block size (or a newer format) never finds another's blocks; ``namespace.json``
beside the blocks says in words whose they are (``macbatch cache`` lists it).

The weights' identity is a fingerprint of the parameters themselves: every array's name, shape and
dtype, and the first bytes of each (what differs between two checkpoints of one architecture, or
two random test models), so a model built in memory is named as safely as one loaded from disk,
and a local directory's files are hashed too (``config.json``, the weight files' names, sizes and
modification times).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from macbatch.engine.kv.disk.files import FORMAT_VERSION
from macbatch.engine.kv.disk.owned import namespace_key

_SAMPLE_ELEMENTS = 256  # of each parameter array, hashed


@dataclass(frozen=True)
class Namespace:
    """What names a model's blocks on disk (``key`` is the directory's name)."""

    model: str
    model_type: str
    weights: str  # the fingerprint
    dtype: str
    kv_bits: int | None
    kv_group_sizes: tuple[int, ...]  # per layer, resolved (None: float pages)
    block_size: int
    layers: tuple[tuple[int, int], ...]  # (KV heads, head dim) per full-attention layer
    prefix_root: str
    # the other cache groups' layouts (their parts' files are read back into them)
    window: int | None = None  # the sliding window's tokens (None: no window group)
    window_layers: tuple[tuple[int, int], ...] = ()  # (KV heads, head dim) per window layer
    layer_slots: tuple[tuple[bool, int], ...] = ()  # model layer -> (in the window group, index)
    states: tuple[str, ...] = ()  # a hybrid's state arrays: "shape dtype", layer by layer
    format_version: int = FORMAT_VERSION
    indexer_keys: str | None = None  # the indexer keys' own page format ("fp8"; None: as kv_bits)
    # held library caches: their payload's format, then each cache object's class and fields
    # (``stores/held_bytes.layout``; empty: none held)
    held: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return namespace_key(self._fields())

    def record(self) -> dict[str, object]:
        """What ``namespace.json`` holds: the fields, and when the namespace was made."""
        return {**self._fields(), "created": time.time()}

    def _fields(self) -> dict[str, Any]:
        """The fields that name it: ``indexer_keys`` and ``held`` only when set, so a namespace
        without them keeps the name (and record) it always had."""
        fields = asdict(self)
        if self.indexer_keys is None:
            del fields["indexer_keys"]
        if not self.held:
            del fields["held"]
        return fields


def weights_fingerprint(model: nn.Module, name: str) -> str:
    """Hash of the parameters' names, shapes, dtypes and first elements, and of a local model
    directory's config and weight files."""
    digest = hashlib.blake2b(digest_size=16)
    samples = []
    params = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    for key, array in params:
        if not isinstance(array, mx.array):
            continue
        digest.update(f"{key}:{array.shape}:{array.dtype}".encode())
        samples.append(array.reshape(-1)[:_SAMPLE_ELEMENTS])
    for sample in samples:
        digest.update(memoryview(_raw(sample)))
    directory = Path(name)
    if directory.is_dir():
        config = directory / "config.json"
        if config.exists():
            digest.update(config.read_bytes())
        for path in sorted(directory.glob("*.safetensors")):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _raw(array: mx.array) -> bytes:
    """An array's bytes, whatever its dtype (numpy has no bfloat16)."""
    import numpy as np

    return np.array(array.view(mx.uint8)).tobytes()
