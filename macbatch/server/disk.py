"""What the server keeps on disk (stored responses, batch files, batch objects), one JSON record
per file. Each is written beside its place, flushed to the disk and renamed over it, so a crash,
``kill -9`` or power cut leaves the old record or the new one, never half of one. A disk can
still hold a broken one (a full disk, a hand edit, a copy cut short), so each is read back
defensively: one that does not parse, is not Unicode text or lacks a field is skipped with one
log line (its path in the data directory, and why), never the server's end."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Shape = Mapping[str, type]  # the fields a record must hold, and their types
log = logging.getLogger("macbatch.server")


def write_record(path: Path, data: Any) -> None:
    """Write ``path`` whole or not at all, through a temporary file of a name no one else can
    have made (never through a link planted at a predictable name, never over another file)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, ensure_ascii=False))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # its own, just made
        raise


def read_record(
    path: Path,
    root: Path,
    shape: Shape,
    problem: Callable[[Path, dict[str, Any]], str | None] = lambda path, record: None,
) -> dict[str, Any] | None:
    """The record at ``path``: a JSON object with ``shape``'s fields and no ``problem`` (what
    else its store requires of it); otherwise None, and a warning naming it relative to
    ``root`` (the data directory)."""
    reason: str | None
    try:
        record = json.loads(path.read_bytes())
    except OSError as exc:
        reason = f"cannot read it: {exc.strerror}"
    except (ValueError, RecursionError) as exc:
        reason = f"not valid JSON: {exc}"
    else:
        reason = _shape_problem(record, shape) or problem(path, record)
    if reason is None:
        return record
    log.warning("skipped %s: %s", path.relative_to(root), reason)
    return None


def _shape_problem(record: Any, shape: Shape) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # served as UTF-8 JSON, it would be a 500 at every listing
        return "it holds a lone UTF-16 surrogate, which is not Unicode text"
    for name, kind in shape.items():
        if not isinstance(record.get(name), kind):
            return f"'{name}' is missing or not a {kind.__name__}"
    return None
