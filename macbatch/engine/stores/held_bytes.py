"""A checkpoint of held caches (``held_caches.py``) as bytes for the disk tier, and back.

A held checkpoint is the library's cache objects of every layer (mlx-lm's ``LayerCache``,
mlx-vlm's ``CacheList`` of a rotating window and pooling caches), which the tier cannot write as
they are. ``payload`` writes every array field of every object, one after another, behind a
header (JSON) holding each object's class and field names, each array's dtype and shape, and the
scalar fields that say how the arrays are read (offsets, a rotating window's write index, an
open group's remainder). ``rebuild`` sets those fields on fresh caches of the family's kind
(``HeldCaches.new_caches``), so nothing read from disk names a class to build, and refuses a payload
whose objects or fields are not those caches' (the namespace names the layout too: ``layout``,
so another library version or model never reads these files).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.stores.held_caches import cache_parts

FORMAT = "held-caches-1"  # the payload's layout (the disk tier's tag for these parts)
_LENGTH_BYTES = 8  # the header's length, little endian, before it
_SCALARS = (bool, int, float, str)


def _name(part: Any) -> str:
    kind = type(part)
    return f"{kind.__module__}.{kind.__qualname__}"


def layout(caches: Sequence[Any]) -> tuple[str, ...]:
    """Each cache object's class and fields, layer by layer (what the namespace names)."""
    return tuple(f"{_name(p)}({','.join(vars(p))})" for cache in caches for p in cache_parts(cache))


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, _SCALARS)


def writable(caches: Sequence[Any]) -> bool:
    """Whether ``payload`` writes caches of this kind: every field an array or a scalar (checked
    on new caches, so a library whose caches hold something else keeps the tier off)."""
    values = (v for cache in caches for p in cache_parts(cache) for v in vars(p).values())
    return all(isinstance(v, mx.array) or _scalar(v) for v in values)


def payload(caches: Sequence[Any]) -> mx.array:
    """One checkpoint's caches as a 1-D uint8 array (lazy): the header's length, the header,
    then every array's bytes in the header's order. ``TypeError`` for a field that is neither an
    array nor a scalar (none of the library's caches has one outside a speculation the engine
    never starts)."""
    records, arrays = [], []
    for part in (p for cache in caches for p in cache_parts(cache)):
        scalars, shapes = {}, {}
        for name, value in vars(part).items():
            if isinstance(value, mx.array):
                shapes[name] = [str(value.dtype).rsplit(".", 1)[-1], list(value.shape)]
                arrays.append(value.reshape(-1).view(mx.uint8))
            elif _scalar(value):
                scalars[name] = value
            else:
                raise TypeError(f"{_name(part)}.{name} is {type(value).__name__}, not kept")
        records.append({"class": _name(part), "scalars": scalars, "arrays": shapes})
    header = json.dumps(records).encode()
    head = len(header).to_bytes(_LENGTH_BYTES, "little") + header
    return mx.concatenate([mx.array(np.frombuffer(head, np.uint8)), *arrays])


def rebuild(data: np.ndarray, fresh: list[Any]) -> list[Any] | None:
    """``fresh`` (new caches of the family's kind) holding the checkpoint ``payload`` wrote
    into ``data`` (1-D uint8); None when ``data`` is not a payload of these caches."""
    try:
        return _rebuilt(data, fresh)
    except (ValueError, TypeError, KeyError, AttributeError):  # a header not of this format
        return None


def _rebuilt(data: np.ndarray, fresh: list[Any]) -> list[Any] | None:
    length = int.from_bytes(data[:_LENGTH_BYTES].tobytes(), "little")
    records = json.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + length].tobytes())
    parts = [p for cache in fresh for p in cache_parts(cache)]
    if not isinstance(records, list) or len(records) != len(parts):
        return None
    at = _LENGTH_BYTES + length
    for part, record in zip(parts, records):
        scalars, shapes = record["scalars"], record["arrays"]
        if record["class"] != _name(part) or {*scalars, *shapes} != set(vars(part)):
            return None
        if not all(_scalar(value) for value in scalars.values()):
            return None
        for name, value in scalars.items():
            setattr(part, name, value)
        for name, (dtype_name, shape) in shapes.items():
            dtype = getattr(mx, str(dtype_name))
            if not isinstance(dtype, mx.Dtype) or not all(
                isinstance(n, int) and n >= 0 for n in shape
            ):
                return None
            size = math.prod(shape) * dtype.size
            if at + size > data.size:
                return None
            setattr(part, name, mx.array(data[at : at + size]).view(dtype).reshape(shape))
            at += size
    return fresh if at == data.size else None
