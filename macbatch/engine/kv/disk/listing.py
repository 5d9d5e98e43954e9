"""What the disk tier holds, per model, and clearing it (``macbatch cache``, ``macbatch cache
clear [MODEL]``). No MLX: it reads ``namespace.json`` and the files' sizes and times."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from macbatch.engine.kv.disk.files import SUFFIX


@dataclass(frozen=True)
class StoredModel:
    """One namespace of a cache directory: a model in one page format and block size."""

    directory: Path
    model: str  # as the engine was given it ("?": the namespace's description is missing)
    page_format: str  # "bfloat16", "8-bit", ...
    block_size: int
    blocks: int
    bytes: int
    last_use: float | None  # the newest file's modification time (a read touches its file)


def stored_models(root: Path) -> list[StoredModel]:
    """Every namespace under ``root`` with its size, blocks and last use, most recent first."""
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            found.append(_stored(Path(entry.path)))
    return sorted(found, key=lambda m: m.last_use or 0.0, reverse=True)


def _stored(directory: Path) -> StoredModel:
    try:
        record = json.loads((directory / "namespace.json").read_text())
    except (OSError, ValueError):
        record = {}
    blocks = size = 0
    newest: float | None = None
    for path in directory.glob(f"*/*{SUFFIX}"):
        try:
            stat = path.stat()
        except OSError:
            continue
        blocks += 1
        size += stat.st_size
        newest = stat.st_mtime if newest is None else max(newest, stat.st_mtime)
    bits = record.get("kv_bits")
    return StoredModel(
        directory=directory,
        model=str(record.get("model", "?")),
        page_format=f"{bits}-bit" if bits else str(record.get("dtype", "?")).split(".")[-1],
        block_size=int(record.get("block_size", 0)),
        blocks=blocks,
        bytes=size,
        last_use=newest,
    )


def clear_stored(root: Path, model: str | None = None) -> list[StoredModel]:
    """Delete every namespace under ``root`` (``model``: only those of that model, as it was
    named, or its directory's last part); returns what was deleted."""
    deleted = []
    for stored in stored_models(root):
        if model is None or model in (stored.model, Path(stored.model).name):
            shutil.rmtree(stored.directory, ignore_errors=True)
            deleted.append(stored)
    return deleted
