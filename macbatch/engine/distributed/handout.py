"""Which replica runs which queued request: work stealing in small units, grouped by prompt prefix.

Each replica holds at most ``window`` requests (queued or running in its engine); whenever one has
room, the replica holding the fewest gets the next unit of up to ``unit`` requests. A replica that
generates more slowly finishes its requests more slowly, so it has room less often and simply gets
fewer rows. A unit is taken from one prefix group (requests whose prompts start with the same
tokens: a job's system prompt and template), preferring the group the replica was last given, then
a group no other replica is working on, then the oldest, so rows that share a prompt meet the
prefix cache of the replica that already holds it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable


class Handout:
    """The requests not yet handed out, by prefix group, and how many each replica holds."""

    def __init__(self, replicas: int, window: int, unit: int) -> None:
        self.window = window
        self.unit = unit
        self.held = [0] * replicas
        self._groups: OrderedDict[Hashable, deque[str]] = OrderedDict()
        self._group_of: dict[str, Hashable] = {}
        self._affinity: list[Hashable | None] = [None] * replicas

    def __len__(self) -> int:
        return len(self._group_of)

    def add(self, request_id: str, prefix: Hashable) -> None:
        self._groups.setdefault(prefix, deque()).append(request_id)
        self._group_of[request_id] = prefix

    def remove(self, request_id: str) -> bool:
        """Take back a request not handed out yet; False if it was handed out (or unknown)."""
        prefix = self._group_of.pop(request_id, None)
        if prefix is None:
            return False
        group = self._groups[prefix]
        group.remove(request_id)
        if not group:
            del self._groups[prefix]
        return True

    def drain(self) -> list[str]:
        """Every request not handed out yet (they will not be)."""
        waiting = list(self._group_of)
        self._groups.clear()
        self._group_of.clear()
        return waiting

    def assign(self) -> dict[int, list[str]]:
        """Hand out units while some replica has room: replica -> the requests it gets now."""
        given: dict[int, list[str]] = {}
        while self._groups:
            replica = min(range(len(self.held)), key=self.held.__getitem__)
            room = self.window - self.held[replica]
            if room <= 0:
                break
            prefix = self._group_for(replica)
            group = self._groups[prefix]
            unit = [group.popleft() for _ in range(min(self.unit, room, len(group)))]
            if not group:
                del self._groups[prefix]
            for request_id in unit:
                del self._group_of[request_id]
            self.held[replica] += len(unit)
            self._affinity[replica] = prefix
            given.setdefault(replica, []).extend(unit)
        return given

    def finished(self, replica: int) -> None:
        """One request the replica held is over (finished, failed or aborted)."""
        self.held[replica] -= 1

    def _group_for(self, replica: int) -> Hashable:
        mine = self._affinity[replica]
        if mine in self._groups:
            return mine
        taken = {prefix for r, prefix in enumerate(self._affinity) if r != replica}
        return next((p for p in self._groups if p not in taken), next(iter(self._groups)))
