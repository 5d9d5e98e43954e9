"""What a drafter is: it proposes tokens for requests; the engine verifies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class DraftRequest(Protocol):
    """What a drafter reads of a request (a ``Request`` is one)."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> list[int]: ...


class Drafter(Protocol):
    """Proposes up to ``ks[i]`` next tokens for ``requests[i]``, whose every token is on the
    host. Proposals must be deterministic given the sequence (a point-mass draft distribution),
    which makes verification by plain sampling exact (verify.py)."""

    def propose(self, requests: Sequence[DraftRequest], ks: Sequence[int]) -> list[list[int]]: ...

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a request that finished."""
