"""The tensors of a PyTorch ``.pt`` state dict (the zip ``torch.save`` writes: a pickle whose
tensors point at raw storages beside it), read with numpy and without torch: BGE-M3 ships its
sparse and ColBERT heads only this way. The unpickler admits only the names a state dict of
plain tensors uses, so a hostile file cannot run code."""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

# torch storage class -> numpy dtype name ("bfloat16": float32's high half, read as uint16)
_STORAGES = {"FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
             "DoubleStorage": "float64"}  # fmt: skip


class _Storage:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def _rebuild_tensor(
    storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any
) -> np.ndarray:
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * item for s in stride]
    )
    return np.array(view, dtype=np.float32)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _Storage(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a tensor state dict")

    def persistent_load(self, pid: Any) -> np.ndarray:
        _, storage, key, _, _ = pid
        raw = self.archive.read(f"{self.prefix}data/{key}")
        kind = _STORAGES[storage.kind]
        if kind == "bfloat16":
            return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(raw, np.dtype(kind))


def read_torch_state_dict(path: Path) -> dict[str, np.ndarray]:
    """float32 arrays by name."""
    with zipfile.ZipFile(path) as archive:
        pickled = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        prefix = pickled.removesuffix("data.pkl")
        with archive.open(pickled) as file:
            state = _Unpickler(file, archive, prefix).load()
    return {str(k): np.asarray(v, np.float32) for k, v in state.items()}
