"""What the disk tier holds, per model, and clearing it (``macbatch cache``, ``macbatch cache
clear [MODEL]``). No MLX: it reads ``namespace.json`` and the files' sizes and times. Only the
tier's own folders and files count and are deleted (``owned.py``); a folder of the directory
that is not a cache's is listed as such and left alone."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.engine.kv.disk.owned import (
    NAMESPACE_FILE,
    block_entries,
    is_temp_name,
    namespace_record,
    remove_owned,
    shards,
    subfolders,
)


@dataclass(frozen=True)
class StoredModel:
    """One namespace of a cache directory: a model in one page format and block size."""

    directory: Path
    model: str  # as the engine was given it
    page_format: str  # "bfloat16", "8-bit", ...
    block_size: int
    blocks: int
    bytes: int
    last_use: float | None  # the newest file's modification time (a read touches its file)


def stored_models(root: Path) -> list[StoredModel]:
    """Every namespace under ``root`` with its size, blocks and last use, most recent first."""
    found = []
    for directory in subfolders(root):
        record = namespace_record(directory)
        if record is not None:
            found.append(_stored(directory, record))
    return sorted(found, key=lambda m: m.last_use or 0.0, reverse=True)


def not_caches(root: Path) -> list[Path]:
    """What under ``root`` is not one of the tier's namespaces (never counted nor deleted)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [root / name for name in names if namespace_record(root / name) is None]


def _stored(directory: Path, record: dict[str, Any]) -> StoredModel:
    blocks = size = 0
    newest: float | None = None
    for _, found in block_entries(directory):
        blocks += 1
        size += found.st_size
        newest = found.st_mtime if newest is None else max(newest, found.st_mtime)
    bits = record.get("kv_bits")
    page_format = f"{bits}-bit" if bits else str(record.get("dtype", "?")).split(".")[-1]
    if record.get("indexer_keys"):
        page_format += f", {record['indexer_keys']} indexer keys"
    return StoredModel(
        directory=directory,
        model=str(record.get("model", "?")),
        page_format=page_format,
        block_size=int(record.get("block_size", 0)),
        blocks=blocks,
        bytes=size,
        last_use=newest,
    )


def clear_stored(root: Path, model: str | None = None) -> list[StoredModel]:
    """Delete the block files of every namespace under ``root`` (``model``: only those of that
    model, as it was named, or its directory's last part), then their ``namespace.json`` and
    the folders left empty; returns what was deleted. A file the tier did not make stays, and
    so does its folder."""
    deleted = []
    for stored in stored_models(root):
        if model is None or model in (stored.model, Path(stored.model).name):
            _clear(stored.directory)
            deleted.append(stored)
    return deleted


def _clear(directory: Path) -> None:
    for path, _ in list(block_entries(directory)):
        remove_owned(path)
    for folder in [*shards(directory), directory]:
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                if is_temp_name(name):
                    remove_owned(folder / name, temporary=True)
    for shard in shards(directory):
        with contextlib.suppress(OSError):
            shard.rmdir()  # only when empty
    with contextlib.suppress(OSError):
        (directory / NAMESPACE_FILE).unlink()
        directory.rmdir()
