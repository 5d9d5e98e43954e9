"""The engine requests of the rows in flight, gathered into each row's one line.

A row may need several engine requests: an API body's ``n`` choices (one line holding them all,
as serve answers the body), a completions body's list of prompts, an embeddings body's list of
inputs, a query scored against several texts. ``Pending`` knows which row each request belongs
to and gathers their outputs; the row settles when its last output arrives, or when one of its
requests fails (the others are aborted). ``macbatch run`` and the server's Batch API both queue
and settle rows here, each with its own engine's ``submit`` and ``abort``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from macbatch.engine import FinishReason, PoolingParams, PromptInput, RequestOutput, SamplingParams

Request = tuple[PromptInput, SamplingParams | PoolingParams]
Abort = Callable[[str], None]
Row = TypeVar("Row")  # what the caller keeps of each row until it settles
Queued = TypeVar("Queued")  # a request as its caller queues it (a ``Request``, or prepared)
DONE = (FinishReason.STOP, FinishReason.LENGTH)


@dataclass(frozen=True)
class Settled(Generic[Row]):
    """A row whose requests are all over: its outputs in request order, or why it failed."""

    row: Row
    outputs: list[RequestOutput]
    error: str | None = None


@dataclass
class Pending(Generic[Row]):
    _rows: dict[str, tuple[Row, list[RequestOutput | None]]] = field(default_factory=dict)
    _request_rows: dict[str, tuple[str, int]] = field(default_factory=dict)

    def submit(
        self,
        row: Row,
        key: str,
        requests: Sequence[Queued],
        submit: Callable[[Queued], str],
        abort: Abort,
    ) -> None:
        """Queue all of a row's requests or none (``submit`` queues one and returns its id):
        one that cannot be queued (``ValueError``: too long, ...) aborts those queued before it
        and raises."""
        request_ids: list[str] = []
        try:
            for request in requests:
                request_ids.append(submit(request))
        except Exception:
            for request_id in request_ids:
                abort(request_id)
            raise
        self._rows[key] = (row, [None] * len(request_ids))
        for index, request_id in enumerate(request_ids):
            self._request_rows[request_id] = (key, index)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._request_rows

    def __len__(self) -> int:
        """Requests in the engine (those of a failed row included, until their abort ends)."""
        return len(self._request_rows)

    def request_ids(self) -> list[str]:
        return list(self._request_rows)

    def settle(self, output: RequestOutput, abort: Abort) -> Settled[Row] | None:
        """Record a final output: the row once its last output is in, or once one of its
        requests failed (the others are aborted). None: more to come, the row was aborted (not
        done, so a resume runs it again), or it had failed already."""
        key, index = self._request_rows.pop(output.request_id)
        entry = self._rows.get(key)
        if entry is None:
            return None
        row, outputs = entry
        reason = output.finish_reason
        if reason not in DONE:
            del self._rows[key]
            for sibling in [r for r, (k, _) in self._request_rows.items() if k == key]:
                abort(sibling)
            if reason is FinishReason.ABORT:
                return None
            return Settled(row, [], output.error or f"finished with {reason}")
        outputs[index] = output
        if any(o is None for o in outputs):
            return None
        del self._rows[key]
        return Settled(row, [o for o in outputs if o is not None])
