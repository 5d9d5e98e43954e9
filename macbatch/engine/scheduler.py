"""Decides, each step, which requests run and how many tokens each gets.

Order: one decode token for every running request that is generating, then the rest of partially
prefilled prompts, then waiting requests first come first served, until the step's token budget
(``max_num_batched_tokens``) or sequence limit (``max_num_seqs``) is reached. A prompt longer than
the budget left gets a chunk now and the rest in later steps. When a running request needs a block
and none is free, the newest running request is preempted: its blocks go back to the pool and it
returns to the front of the waiting queue, to be recomputed later (cheaply, when its blocks are
still in the prefix cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from macbatch.engine.kv_cache import BlockPool, chain_block_hashes
from macbatch.engine.request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    request: Request
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Only a chunk that completes the request's known tokens yields logits to sample."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        prefix_root: bytes | None,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.prefix_root = prefix_root  # None: prefix caching off
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        scheduled: dict[str, ScheduledChunk] = {}
        for decoding in (True, False):
            for request in list(self.running):
                if budget == 0:
                    break
                if request.request_id in scheduled or request.status is not RequestStatus.RUNNING:
                    continue
                need = request.num_tokens - request.num_computed_tokens
                if (need == 1) != decoding:
                    continue
                n = min(need, budget)
                while not self._reserve(request, n):
                    victim = self.running[-1]
                    budget += self._preempt(victim, scheduled, plan)
                    if victim is request:
                        break
                else:
                    scheduled[request.request_id] = ScheduledChunk(
                        request, request.num_computed_tokens, n
                    )
                    budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            self._take_cached_prefix(request)
            need = request.num_tokens - request.num_computed_tokens
            n = min(need, budget, self._tokens_that_fit(request))
            if n <= 0 or not self._reserve(request, n):
                self._release(request)
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled[request.request_id] = ScheduledChunk(request, request.num_computed_tokens, n)
            budget -= n
        plan.chunks = list(scheduled.values())
        return plan

    def _tokens_that_fit(self, request: Request) -> int:
        capacity = (len(request.block_ids) + self.pool.num_free) * self.block_size
        return capacity - request.num_computed_tokens

    def _reserve(self, request: Request, num_tokens: int) -> bool:
        """Give ``request`` enough blocks for ``num_tokens`` more tokens, if the pool has them."""
        needed = -(-(request.num_computed_tokens + num_tokens) // self.block_size)
        missing = needed - len(request.block_ids)
        if missing > self.pool.num_free:
            return False
        request.block_ids.extend(self.pool.allocate() for _ in range(missing))
        return True

    def _preempt(
        self, victim: Request, scheduled: dict[str, ScheduledChunk], plan: StepPlan
    ) -> int:
        """Send ``victim`` back to waiting; returns the budget its cancelled chunk gave back."""
        chunk = scheduled.pop(victim.request_id, None)
        self.running.remove(victim)
        self._release(victim)
        victim.status = RequestStatus.WAITING
        victim.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        plan.preempted.append(victim)
        return chunk.num_tokens if chunk else 0

    def _release(self, request: Request) -> None:
        """Return all of a request's blocks; it will recompute from scratch (or from the cache)."""
        for block in reversed(request.block_ids):
            self.pool.free(block)
        request.block_ids = []
        request.block_hashes = []
        request.num_computed_tokens = 0

    def _take_cached_prefix(self, request: Request) -> None:
        """Share every cached block matching the prompt's prefix, keeping at least one token to
        compute so the request has logits to sample from."""
        if self.prefix_root is None or request.block_ids:
            return
        usable = (request.num_tokens - 1) // self.block_size
        tokens = request.token_slice(0, usable * self.block_size)
        for digest in chain_block_hashes(self.prefix_root, tokens, self.block_size):
            block = self.pool.lookup(digest)
            if block is None:
                break
            self.pool.share(block)
            request.block_ids.append(block)
            request.block_hashes.append(digest)
        request.num_computed_tokens = len(request.block_ids) * self.block_size

    def register_computed_blocks(self, request: Request) -> None:
        """Name the request's newly completed blocks in the prefix cache."""
        if self.prefix_root is None:
            return
        full = request.num_computed_tokens // self.block_size
        done = len(request.block_hashes)
        if full <= done:
            return
        previous = request.block_hashes[-1] if done else self.prefix_root
        tokens = request.token_slice(done * self.block_size, full * self.block_size)
        new = chain_block_hashes(previous, tokens, self.block_size)
        for block, digest in zip(request.block_ids[done:full], new):
            self.pool.register(block, digest)
        request.block_hashes.extend(new)

    def finish(self, request: Request) -> None:
        """Drop a finished or aborted request and return its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)
