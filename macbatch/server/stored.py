"""Responses kept for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``.

``macbatch serve`` keeps them in its data directory (``responses/``, one JSON file each, written
whole and renamed; a broken one reads as missing, logged once), so a conversation continues
across a restart; without a directory (an app built in a test) they live in memory. Bounded
either way: past ``MAX_STORED`` the oldest go first. Each keeps the response object and the
conversation it ended, as chat messages, so a follow-up continues it without the client sending
it again."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.server.disk import read_record, write_record

MAX_STORED = 10_000
SHAPE = {"response": dict, "conversation": list}
_ID = re.compile(r"resp_[0-9a-f]{32}")  # the renderer's ids; anything else is never stored


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    def __init__(self, root: Path | None = None, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        self.root = root
        self.directory = None if root is None else root / "responses"
        self._items: OrderedDict[str, Stored | None] = OrderedDict()  # None: on disk only
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            paths = self.directory.glob("resp_*.json")
            for path in sorted(paths, key=lambda p: p.stat().st_mtime):
                if _ID.fullmatch(path.stem):  # another name is not one it wrote: left alone
                    self._items[path.stem] = None

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        response_id = response["id"]
        if self.directory is None:
            self._items[response_id] = Stored(response, conversation)
        else:
            data = {"response": response, "conversation": conversation}
            write_record(self._path(response_id), data)
            self._items[response_id] = None
        while len(self._items) > self.capacity:
            self._forget(next(iter(self._items)))

    def get(self, response_id: str) -> Stored | None:
        if response_id not in self._items:
            return None
        stored = self._items[response_id]
        if stored is not None:
            return stored
        assert self.root is not None
        data = read_record(self._path(response_id), self.root, SHAPE)
        if data is None:  # broken: forgotten here (its file is left to look at), so logged once
            self._items.pop(response_id)
            return None
        return Stored(data["response"], data["conversation"])

    def delete(self, response_id: str) -> bool:
        if response_id not in self._items:
            return False
        self._forget(response_id)
        return True

    def _forget(self, response_id: str) -> None:
        self._items.pop(response_id, None)
        if self.directory is not None:
            self._path(response_id).unlink(missing_ok=True)

    def _path(self, response_id: str) -> Path:
        assert self.directory is not None and _ID.fullmatch(response_id), response_id
        return self.directory / f"{response_id}.json"
