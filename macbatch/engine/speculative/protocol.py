"""What a drafter is: it proposes tokens for requests; the engine verifies them."""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import mlx.core as mx

    from macbatch.engine.core.request import Request
    from macbatch.engine.core.scheduler import ScheduledChunk


class Drafter(Protocol):
    """Proposes up to ``ks[i]`` next tokens for ``requests[i]``, whose every token is on the
    host. Proposals must be deterministic given the sequence (a point-mass draft distribution),
    which makes verification by plain sampling exact (verify.py)."""

    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]: ...

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, drafting: Set[str]
    ) -> list[mx.array]:
        """The target's hidden states ``[N, 1, H]`` of a step just dispatched (its chunks' rows
        in order), offered only when the model runner keeps them (an MTP drafter's), and the
        ids of its requests expected to draft soon (``SpeculationPolicy.drafts_soon``: work
        done ahead for the others may never pay); returns what to evaluate with the step."""
        ...

    def truncated(self, request_id: str, num_tokens: int) -> None:
        """The request's KV blocks past its first ``num_tokens`` tokens went back to the pool
        (rejected drafts)."""

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a request that finished."""
