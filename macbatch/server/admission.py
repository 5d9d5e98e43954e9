"""Admission: the bound on engine requests in flight (running plus waiting), server-wide, and
the count of them per model (/metrics' pending gauge, the Batch API's room beside live
requests), both kept by the one counter that admits them."""

from __future__ import annotations

from collections import Counter

from macbatch.server.errors import APIError, invalid


class Admission:
    """Bounds the engine requests in flight (running plus waiting); beyond it, 429."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pending = 0
        self._by_model: Counter[str] = Counter()

    def take(self, count: int, model_id: str) -> None:
        """Admit ``count`` engine requests for ``model_id``: 429 while others fill the server,
        400 if ``count`` alone passes the limit (retrying could never help)."""
        if count > self.capacity:
            raise invalid(
                f"this request needs {count} engine requests (prompts x n), more than the server "
                f"admits at once ({self.capacity}); ask for fewer choices",
                "n",
            )
        if self.pending + count > self.capacity:
            raise APIError(
                429,
                f"the server is busy: {self.pending} requests are running or queued "
                f"(limit {self.capacity}); retry later",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.pending += count
        self._by_model[model_id] += count

    def give_back(self, count: int, model_id: str) -> None:
        self.pending -= count
        self._by_model[model_id] -= count

    def pending_of(self, model_id: str) -> int:
        """The engine requests admitted for one model and not finished."""
        return self._by_model[model_id]
