"""Files for the Batch API, in the server's data directory: the content as uploaded and a small
JSON description beside it (OpenAI's file object). Batch outputs join the same store when a
batch ends, so ``GET /v1/files/{id}/content`` serves inputs and outputs alike."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from macbatch.server.disk import read_record, write_record
from macbatch.server.errors import APIError

_ID = re.compile(r"file-[0-9a-f]{32}")
CHUNK = 1 << 20
SHAPE = {"id": str, "bytes": int, "created_at": int, "filename": str, "purpose": str}


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def not_found(file_id: str) -> APIError:
    return APIError(
        404, f"no file {file_id!r}; see GET /v1/files", param="file_id", code="file_not_found"
    )


class FileStore:
    """``files/<id>.json`` (the file object) and ``files/<id>.data`` (the bytes) per file, under
    the data directory ``root``. The description is written last, so a file exists only once its
    bytes are whole. Descriptions are read once, at start, and kept in memory: one server per
    data directory runs the Batch API (service.py's lock)."""

    def __init__(self, root: Path) -> None:
        self.directory = root / "files"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files: dict[str, dict[str, Any]] = {}
        for path in self.directory.glob("file-*.json"):
            meta = read_record(path, root, SHAPE, self._problem)
            if meta is not None:
                self._files[meta["id"]] = meta

    def content_path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.data"

    def save(self, source: BinaryIO, filename: str, purpose: str, limit: int) -> dict[str, Any]:
        """Copy an upload in, refusing it (413) past ``limit`` bytes."""
        file_id = new_file_id()
        partial = self.content_path(file_id).with_suffix(".part")
        size = 0
        with partial.open("wb") as target:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    target.close()
                    partial.unlink()
                    raise too_large(limit)
                target.write(chunk)
        os.replace(partial, self.content_path(file_id))
        return self.adopt(file_id, filename, purpose)

    def adopt(self, file_id: str, filename: str, purpose: str) -> dict[str, Any]:
        """Describe the bytes already at ``content_path(file_id)`` (an upload, a batch's output)."""
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": self.content_path(file_id).stat().st_size,
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        with self._lock:
            write_record(self.directory / f"{file_id}.json", meta)
            self._files[file_id] = meta
        return dict(meta)

    def get(self, file_id: str) -> dict[str, Any]:
        """The file object, or 404."""
        with self._lock:
            meta = self._files.get(file_id)
        if meta is None:
            raise not_found(file_id)
        return dict(meta)

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        with self._lock:
            self._files.pop(file_id, None)
            (self.directory / f"{file_id}.json").unlink(missing_ok=True)
            self.content_path(file_id).unlink(missing_ok=True)

    def all(self) -> list[dict[str, Any]]:
        """Every file, newest first."""
        with self._lock:
            found = [dict(meta) for meta in self._files.values()]
        return sorted(found, key=lambda f: (f["created_at"], f["id"]), reverse=True)

    def _problem(self, path: Path, meta: dict[str, Any]) -> str | None:
        if meta["id"] != path.stem or not _ID.fullmatch(meta["id"]):
            return f"its id {meta['id']!r} is not the file's name"
        if not self.content_path(meta["id"]).is_file():
            return f"its content {meta['id']}.data is missing"
        return None


def too_large(limit: int) -> APIError:
    message = f"the file is over {limit:,} bytes, this server's limit; split it or raise "
    return APIError(413, message + "serve --max-file-mb", param="file", code="file_too_large")
