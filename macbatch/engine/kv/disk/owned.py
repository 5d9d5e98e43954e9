"""What in a cache directory the disk tier made: the only folders and files it reads, counts,
evicts or deletes (docs/architecture.md, "What a command may delete"). A ``--cache-dir`` may be
a folder holding other things, or one others can write to, so each is recognised by its name
and its contents, and nothing is followed through a link:

- a namespace: a real folder (not a link) whose ``namespace.json`` is a regular file whose
  fields hash to the folder's name (``namespace_key``);
- a shard: a real folder in it named by two hex digits;
- a block file: a regular file in a shard named ``<32 hex>.kvb`` that starts with the magic
  ``MBKV`` (the header, ``files.py``);
- a temporary file: a regular file in a shard or namespace named as the tier names its own
  (``<32 hex>.kvb.<pid>.<n>.tmp``, ``namespace.json.<pid>.<n>.tmp``), empty or starting with the
  magic (a block's).

Anything else is left alone, and ``macbatch cache`` reports a folder that is not a namespace.
No MLX: ``macbatch cache`` uses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAGIC = b"MBKV"
SUFFIX = ".kvb"
NAMESPACE_FILE = "namespace.json"
_SHARD = re.compile(r"[0-9a-f]{2}")
_BLOCK = re.compile(r"[0-9a-f]{32}\.kvb")
_BLOCK_TEMP = re.compile(r"[0-9a-f]{32}\.kvb\.\d+\.\d+\.tmp")
_NAMESPACE_TEMP = re.compile(r"namespace\.json\.\d+\.\d+\.tmp")
_UNDESCRIBED = "created"  # the one field of ``namespace.json`` its name does not hash


def namespace_key(fields: dict[str, Any]) -> str:
    """A namespace folder's name: the hash of what names its blocks (``Namespace``'s fields)."""
    named = {k: v for k, v in fields.items() if k != _UNDESCRIBED}
    blob = json.dumps(named, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


def _lstat(path: Path | str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def is_real_dir(path: Path | str) -> bool:
    """A folder itself, not a link to one."""
    found = _lstat(path)
    return found is not None and stat.S_ISDIR(found.st_mode)


def namespace_record(directory: Path) -> dict[str, Any] | None:
    """``directory``'s ``namespace.json`` when it is one of the tier's namespaces, else None."""
    if not is_real_dir(directory):
        return None
    path = directory / NAMESPACE_FILE
    found = _lstat(path)
    if found is None or not stat.S_ISREG(found.st_mode) or found.st_size > 1 << 20:
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or namespace_key(record) != directory.name:
        return None
    return record


def subfolders(root: Path) -> list[Path]:
    """The real folders (not links) right under ``root``, by name."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]


def shards(namespace: Path) -> list[Path]:
    return [path for path in subfolders(namespace) if _SHARD.fullmatch(path.name)]


def block_entries(namespace: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """A namespace's block files (by name; regular files only) and their ``lstat``."""
    for shard in shards(namespace):
        try:
            entries = list(os.scandir(shard))
        except OSError:
            continue
        for entry in entries:
            if not _BLOCK.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                found = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(found.st_mode):
                    yield Path(entry.path), found


def is_block_name(name: str) -> bool:
    return _BLOCK.fullmatch(name) is not None


def is_temp_name(name: str) -> bool:
    return _BLOCK_TEMP.fullmatch(name) is not None or _NAMESPACE_TEMP.fullmatch(name) is not None


def _starts_with_magic(path: Path, allow_empty: bool) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        head = os.read(fd, len(MAGIC))
    finally:
        os.close(fd)
    return head == MAGIC or (allow_empty and not head)


def remove_owned(path: Path, temporary: bool = False) -> bool:
    """Delete ``path`` if it is the tier's own block file (``temporary``: its own temporary
    file) in a real shard of a real folder (never through a link); whether it was deleted."""
    name = path.name
    if not (is_temp_name(name) if temporary else is_block_name(name)):
        return False
    described = name.startswith(NAMESPACE_FILE)  # in the namespace folder, not a shard
    folders = (path.parent,) if described else (path.parent, path.parent.parent)
    if not all(is_real_dir(folder) for folder in folders):
        return False
    found = _lstat(path)
    if found is None or not stat.S_ISREG(found.st_mode):
        return False
    if not described and not _starts_with_magic(path, temporary):
        return False
    try:
        path.unlink()
    except OSError:
        return False
    return True
