"""Batch objects (OpenAI's shape), one ``batch.json`` per batch directory, rewritten whole at
each change of status; the directory also holds the batch's output, errors and ledger. Request
counts move in memory as rows finish and are saved with the next status; after a restart the
worker recounts them from the ledger."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from macbatch.server.disk import read_record, write_record
from macbatch.server.errors import APIError

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # the worker still owes work
_ID = re.compile(r"batch_[0-9a-f]{32}")
WINDOW_S = 24 * 3600  # completion_window "24h", the one value OpenAI accepts
SHAPE = {
    "id": str,
    "status": str,
    "created_at": int,
    "input_file_id": str,
    "endpoint": str,
    "request_counts": dict,
}


def not_found(batch_id: str) -> APIError:
    return APIError(
        404,
        f"no batch {batch_id!r}; see GET /v1/batches",
        param="batch_id",
        code="batch_not_found",
    )


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch as clients see it (without the worker's own ``_`` fields)."""
    return {key: value for key, value in batch.items() if not key.startswith("_")}


class BatchStore:
    """``batches/<id>/batch.json`` per batch under the data directory ``root``, read once at
    start (a broken one skipped and logged) and kept in memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.directory = root / "batches"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._batches: dict[str, dict[str, Any]] = {}
        for path in self.directory.glob("batch_*/batch.json"):
            batch = read_record(path, root, SHAPE, _problem)
            if batch is not None:
                self._batches[batch["id"]] = batch

    def folder(self, batch_id: str) -> Path:
        return self.directory / batch_id

    def create(self, fields: dict[str, Any], total: int) -> dict[str, Any]:
        now = int(time.time())
        batch = {
            "id": f"batch_{uuid.uuid4().hex}",
            "object": "batch",
            "errors": None,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + WINDOW_S,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0},
            **fields,
        }
        self.folder(batch["id"]).mkdir()
        with self._lock:
            self._save(batch)  # first: a batch that cannot be saved never runs
            self._batches[batch["id"]] = batch
        return dict(batch)

    def get(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            batch = self._batches.get(batch_id) if _ID.fullmatch(batch_id) else None
            if batch is None:
                raise not_found(batch_id)
            return json.loads(json.dumps(batch))

    def all(self) -> list[dict[str, Any]]:
        """Every batch, newest first."""
        with self._lock:
            found = [json.loads(json.dumps(b)) for b in self._batches.values()]
        return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def active(self) -> list[str]:
        """Batches the worker owes work, oldest first (a restart resumes them in this order)."""
        return [b["id"] for b in reversed(self.all()) if b["status"] in ACTIVE]

    def set_status(
        self,
        batch_id: str,
        status: str,
        when: tuple[str, ...] = (),
        fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Move to ``status`` (stamping its ``<status>_at``) with ``fields`` and save; with
        ``when``, only from one of those statuses (the batch thread and a cancel may race). The
        change holds in memory even when the save fails (which raises)."""
        with self._lock:
            batch = self._batches[batch_id]
            if when and batch["status"] not in when:
                return dict(batch)
            stamp = {"in_progress": "in_progress_at"}.get(status, f"{status}_at")
            batch.update(fields or {}, status=status)
            if stamp in batch and batch[stamp] is None:
                batch[stamp] = int(time.time())
            self._save(batch)
            return dict(batch)

    def count(self, batch_id: str, completed: int, failed: int) -> None:
        with self._lock:
            self._batches[batch_id]["request_counts"].update(completed=completed, failed=failed)

    def _save(self, batch: dict[str, Any]) -> None:
        write_record(self.folder(batch["id"]) / "batch.json", batch)


def _problem(path: Path, batch: dict[str, Any]) -> str | None:
    if batch["id"] != path.parent.name:
        return f"its id {batch['id']!r} is not its folder's name"
    return None
