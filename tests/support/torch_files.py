"""Writes a state dict of float32 arrays as the zip ``torch.save`` makes (``archive/data.pkl``
pickling each tensor as ``torch._utils._rebuild_tensor_v2`` over a persistent ``FloatStorage``
whose bytes are ``archive/data/<key>``), with no torch installed: for BGE-M3's
``sparse_linear.pt`` and ``colbert_linear.pt``. The pickle names torch's own globals, so
stand-in modules named ``torch`` are in ``sys.modules`` only while it is written."""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import numpy as np


class _Tensor:
    def __init__(self, key: str, array: np.ndarray) -> None:
        self.key, self.array = key, array

    def __reduce__(self) -> tuple:
        strides = tuple(s // self.array.itemsize for s in self.array.strides)
        storage = _StorageRef(self.key, self.array.size)
        rebuild = sys.modules["torch._utils"]._rebuild_tensor_v2
        return (rebuild, (storage, 0, self.array.shape, strides, False, collections.OrderedDict()))


class _StorageRef:
    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            storage = sys.modules["torch"].FloatStorage
            return ("storage", storage, obj.key, "cpu", obj.numel)
        return None


def _standin_torch() -> dict[str, types.ModuleType]:
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args: Any) -> None: ...

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    storage = type("FloatStorage", (), {"__module__": "torch"})
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    torch.FloatStorage = storage  # type: ignore[attr-defined]
    torch._utils = utils  # type: ignore[attr-defined]
    return {"torch": torch, "torch._utils": utils}


def write_torch_state_dict(path: Path, state: dict[str, np.ndarray]) -> None:
    standins = _standin_torch()
    assert not any(name in sys.modules for name in standins), "a real torch is loaded"
    sys.modules.update(standins)
    try:
        tensors = collections.OrderedDict(
            (name, _Tensor(str(i), np.ascontiguousarray(a, np.float32)))
            for i, (name, a) in enumerate(state.items())
        )
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=2).dump(tensors)
    finally:
        for name in standins:
            del sys.modules[name]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        for tensor in tensors.values():
            archive.writestr(f"archive/data/{tensor.key}", tensor.array.tobytes())
        archive.writestr("archive/version", "3\n")
