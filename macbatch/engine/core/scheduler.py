"""Decides, each step, which requests run and how many tokens each gets.

Order: one decode token for every running request that is generating, then the rest of partially
prefilled prompts, then waiting requests first come first served, until the step's token budget
(``max_num_batched_tokens``) or sequence limit (``max_num_seqs``) is reached. A prompt longer than
the budget left gets a chunk now and the rest in later steps. When a running request needs a block
and none is free, the newest running request is preempted: its blocks go back to the pool and it
returns to the front of the waiting queue, to be recomputed later (cheaply, when its blocks are
still in the prefix cache).

Policy only: blocks are the KV manager's (``kv/manager.py``). With the pipelined step a request
may hold a pending token (sampled, not yet read by the host); it is scheduled like a known one,
except that a preempted request is not readmitted before its pending token is known (its
recompute needs every token on the host).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from macbatch.engine.core.request import Request, RequestStatus
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.pooling.methods import PoolSpan


@dataclass(slots=True)
class ScheduledChunk:
    request: Request
    start: int
    num_tokens: int
    # Speculative decoding: the chunk's last ``num_drafts`` tokens are the request's drafts
    # (``Request.drafts``), verified by sampling every row after the first.
    num_drafts: int = 0
    # Only a chunk that completes the request's tokens yields logits to sample (a pooling
    # request's never does: it pools). Decided when scheduled: reading the step in flight may
    # end the request before this step samples.
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        completes = self.start + self.num_tokens - self.num_drafts == self.request.num_tokens
        self.samples = completes and self.request.pooling is None


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    def pool_spans(self) -> list[PoolSpan]:
        """The pooling requests' chunks and their rows in the packed step (rows follow the
        chunks in order)."""
        spans = []
        row = 0
        for c in self.chunks:
            request = c.request
            if request.pooling is not None:
                end = c.start + c.num_tokens
                spans.append(
                    PoolSpan(
                        request.request_id, request.pooling, row, row + c.num_tokens,
                        first=c.start == 0, last=end == request.num_tokens,
                        num_tokens=request.num_tokens,
                    )
                )  # fmt: skip
            row += c.num_tokens
        return spans


class Scheduler:
    def __init__(
        self,
        kv: KVManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        long_rope_after: int | None = None,
    ) -> None:
        """``long_rope_after``: a LongRoPE model's original positions (``_rotated_long``)."""
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.long_rope_after = long_rope_after
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        if self._crosses_long_rope(request, request.num_tokens):
            request.rotate_long()  # before its blocks are looked up (the disk tier's too)
        self.waiting.append(request)

    def schedule(self) -> StepPlan:
        """Who runs this step and how many tokens each; blocks are reserved for all of them and
        ``num_computed_tokens`` is left for the engine to advance when it dispatches the step."""
        budget = self.max_num_batched_tokens
        scheduled: dict[str, ScheduledChunk] = {}
        decodes: list[tuple[Request, int]] = []  # (request, tokens it needs)
        prefills: list[tuple[Request, int]] = []
        for request in self.running:
            need = request.num_tokens_to_compute
            if need == 1:  # a decode verifies its drafts in the same chunk, budget permitting
                self._drafts_within_short(request)
                decodes.append((request, need + len(request.drafts)))
            elif need:
                prefills.append((request, need))
        for request, need in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            n = request.chunk_tokens(min(need, budget))
            if n == 0:  # an image block that attends both ways waits for a step it fits in
                budget = 0
                break
            if self._crosses_long_rope(request, request.num_computed_tokens + n):
                self._recompute_long(request)  # readmitted below, its sequence computed anew
                continue
            while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, n):
                victim = self.running[-1]
                budget += self._preempt(victim, scheduled)
                if victim is request:
                    break
            else:
                drafts = n - request.num_tokens_to_compute if request.drafts else 0
                scheduled[request.request_id] = ScheduledChunk(
                    request, request.num_computed_tokens, n, max(0, drafts)
                )
                budget -= n
        passed = 0  # waiting requests passed over: their blocks are still being read from disk
        while len(self.waiting) > passed and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[passed]
            if request.num_pending:
                break  # preempted mid-flight: recomputing needs its last token on the host
            if not self.kv.prefix_ready(request.request_id):
                passed += 1
                continue
            if self._crosses_long_rope(request, request.num_tokens):
                request.rotate_long()  # preempted at the crossing, before it was computed
            # A waiting request holds no blocks: start from whatever prefix is cached.
            request.num_computed_tokens = self._cached_prefix(request)
            need = request.num_tokens - request.num_computed_tokens
            fit = self.kv.tokens_that_fit(request.request_id, request.num_computed_tokens)
            n = request.chunk_tokens(min(need, budget, fit))
            if n <= 0 or not self.kv.allocate_slots(
                request.request_id, request.num_computed_tokens, n
            ):
                self._release(request)
                break
            del self.waiting[passed]
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled[request.request_id] = ScheduledChunk(request, request.num_computed_tokens, n)
            budget -= n
        return StepPlan(list(scheduled.values()))

    def _cached_prefix(self, request: Request) -> int:
        """The tokens a waiting request finds computed in cached blocks (it shares them); none
        for pooling that reads every row's hidden state (mean, first token)."""
        if not request.reads_cached_prefix:
            return 0
        return self.kv.take_cached_prefix(request, request.num_tokens)

    def _crosses_long_rope(self, request: Request, end: int) -> bool:
        """Whether a LongRoPE model's request, still rotated short, would compute a position
        past the original ones by ``end``: transformers' Phi-3 then rotates the whole sequence by
        the long factors, its cache dropped and computed anew (``prepare_inputs_for_generation``;
        a prompt past them is long from its first token)."""
        after = self.long_rope_after
        return after is not None and not request.long_rope and end > after

    def _drafts_within_short(self, request: Request) -> None:
        """A LongRoPE request still rotated short verifies no draft past the original
        positions: its token there is computed after the sequence is computed anew, long, as
        without drafts."""
        after = self.long_rope_after
        if after is not None and not request.long_rope and request.drafts:
            del request.drafts[max(0, after - request.num_tokens) :]

    def _recompute_long(self, request: Request) -> None:
        """``request`` rotated long from now on, sent to the front of the queue holding no
        blocks (not a preemption: no memory was short)."""
        request.rotate_long()
        request.drafts = []
        self.running.remove(request)
        self._release(request)
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def _preempt(self, victim: Request, scheduled: dict[str, ScheduledChunk]) -> int:
        """Send ``victim`` back to waiting; returns the budget its cancelled chunk gave back."""
        chunk = scheduled.pop(victim.request_id, None)
        victim.drafts = []
        self.running.remove(victim)
        self._release(victim)
        victim.status = RequestStatus.WAITING
        victim.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return chunk.num_tokens if chunk else 0

    def _release(self, request: Request) -> None:
        """Return all of a request's blocks; it will recompute from scratch (or from the cache)."""
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0

    def requeue(self, request: Request) -> None:
        """Send ``request`` to the front of the queue holding no blocks, to recompute what it
        had computed (its known tokens stay): a failed step's requests (engine.py)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)
        request.drafts = []
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    @contextlib.contextmanager
    def alone(self, request: Request) -> Iterator[None]:
        """Schedule ``request`` only, meanwhile (the trial of a failed step's request); the
        others keep their blocks and their places, and come back after it."""
        running, waiting = self.running, self.waiting
        self.running = [r for r in running if r is request]
        self.waiting = deque(r for r in waiting if r is request)
        try:
            yield
        finally:
            self.running = [r for r in running if r is not request] + self.running
            self.waiting.extend(r for r in waiting if r is not request)

    def finish(self, request: Request) -> None:
        """Drop a finished or aborted request and return its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)
