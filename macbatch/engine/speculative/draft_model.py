"""A draft model: a small model with the target's tokenizer proposes the next tokens greedily,
one packed forward per draft token over every request that speculates.

The draft's K/V lives in the request's own KV blocks (draft_runner.py). A proposal for k tokens
first takes the blocks the drafts' positions need (none taken: the request does not speculate
this step; a guess never preempts anyone), then runs k forwards of the draft model, each over
all speculating requests together: the first packs each request's catch-up chunk (the tokens
whose draft K/V its blocks do not hold yet: its prompt the first time, then the accepted drafts
and the target's token) and samples each one's last row; the next k-1 are one row per request,
each fed the previous draft on the device. The drafts are read back once, at the end. Drafting
is greedy, so the draft distribution is a point mass (verify.py).

A hybrid draft's recurrent state cannot be cut back to the accepted drafts, so the catch-up
chunk leaves the state after the request's known tokens in its slot, and the drafts run on
through the slot's snapshot (thrown away): the next catch-up starts where the known tokens
ended. A request keeps its slot until it finishes: the slots held are never more than
``max_num_seqs``, because a preempted request waits at the front of the queue, so no request is
admitted while one holding a slot waits.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import mlx.core as mx

from macbatch.engine.core.packing import pack
from macbatch.engine.core.scheduler import ScheduledChunk, StepPlan
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.model.recurrent import StateChunk
from macbatch.engine.speculative.draft_runner import DraftRunner

if TYPE_CHECKING:
    from macbatch.engine.core.request import Request


@dataclass
class Written:
    """What a request's blocks hold of a drafter's K/V (a draft model's, an MTP layer's): rows
    for ``tokens`` from position 0, of which the first ``valid`` positions are in blocks held
    since (truncation gives back blocks past the accepted tokens; another request may have
    written those since)."""

    tokens: list[int]
    valid: int
    preemptions: int  # the request's count when written: a preemption gave back every block
    known: int  # the tokens a hybrid draft's state slot has run through


@dataclass
class _Row:
    index: int  # in the proposal's requests
    request: Request
    k: int
    tokens: list[int]  # every token of the request (all on the host)
    start: int  # the first position whose draft K/V is computed now
    slot: int = -1  # a hybrid draft's state slot


class DraftModelDrafter:
    def __init__(self, runner: DraftRunner, kv: KVManager) -> None:
        self.runner = runner
        self.kv = kv
        self._written: dict[str, Written] = {}
        self._slots: dict[str, int] = {}  # a hybrid draft's state slot of each request

    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in requests]
        rows = self._reserve(requests, ks)
        if not rows:
            return proposals
        for row, drafts in zip(rows, self._run(rows)):
            proposals[row.index] = drafts
            # the last draft's K/V is not written: it is the next step's input
            held = row.tokens + drafts[:-1]
            preemptions = row.request.metrics.preemptions
            written = Written(held, len(held), preemptions, len(row.tokens))
            self._written[row.request.request_id] = written
        return proposals

    def _reserve(self, requests: Sequence[Request], ks: Sequence[int]) -> list[_Row]:
        """The requests whose drafts' positions got blocks, longest drafts first (so each later
        forward's rows are a prefix of the one before)."""
        rows = []
        for index, (request, k) in enumerate(zip(requests, ks)):
            tokens = request.all_token_ids
            # the draft writes K/V up to the next-to-last draft's position
            if self.kv.allocate_slots(request.request_id, len(tokens) - 1, k):
                slot = -1 if self.runner.slots is None else self._slot(request.request_id)
                start = self._start(request, tokens)
                rows.append(_Row(index, request, k, tokens, start, slot))
        rows.sort(key=lambda r: -r.k)
        return rows

    def _start(self, request: Request, tokens: list[int]) -> int:
        """Where the catch-up chunk starts: after the longest prefix of ``tokens`` whose draft
        K/V the request's blocks still hold, feeding at least the last token (a hybrid draft:
        where its state is, or from the start)."""
        written = self._written.get(request.request_id)
        if written is None or written.preemptions != request.metrics.preemptions:
            return 0
        most = min(written.valid, len(tokens) - 1)
        start = shared_prefix(written.tokens, tokens, most)
        if self.runner.slots is None:
            return start
        return written.known if start >= written.known else 0

    def _slot(self, request_id: str) -> int:
        """The request's state slot, taken if it has none."""
        assert self.runner.slots is not None
        if request_id in self._slots:
            return self._slots[request_id]
        self._slots[request_id] = slot = self.runner.slots.take()
        self._written.pop(request_id, None)  # its state starts from zeros
        return slot

    def _run(self, rows: list[_Row]) -> list[list[int]]:
        """k forwards over every row (the first: catch-up chunks; then one draft each), read
        back once."""
        tables = [self.kv.block_table(r.request.request_id) for r in rows]
        self._catch_up(rows, tables)
        chunks = [ScheduledChunk(r.request, r.start, len(r.tokens) - r.start) for r in rows]
        steps = [self._forward(chunks, tables, self._states(rows, 0))]
        for j in range(1, rows[0].k):
            live = [r for r in rows if r.k > j]
            chunks = [ScheduledChunk(r.request, len(r.tokens) + j - 1, 1) for r in live]
            steps.append(
                self._forward(chunks, tables, self._states(live, j), steps[-1][: len(live)])
            )
        mx.eval(*steps, *self.runner.arrays())
        tokens = [cast(list[int], s.tolist()) for s in steps]
        return [[tokens[j][i] for j in range(r.k)] for i, r in enumerate(rows)]

    def _catch_up(self, rows: list[_Row], tables: list[list[int]]) -> None:
        """Catch-up chunks longer than a step's budget (a new request's whole prompt) run first
        in forwards of at most ``max_num_batched_tokens`` rows, each evaluated, as the target's
        prefill is chunked: one forward of every request's prompt would hold all their
        activations at once. Each row's last token is left for the first sampled forward."""
        budget = self.runner.max_rows
        while sum(len(r.tokens) - r.start for r in rows) > budget:
            picked: list[tuple[_Row, list[int], int]] = []
            room = budget
            for row, table in zip(rows, tables):
                n = min(room, len(row.tokens) - row.start - 1)
                if n > 0:
                    picked.append((row, table, n))
                    room -= n
            if not picked:  # more rows of one token each than the budget: nothing to split
                return
            chunks = [ScheduledChunk(r.request, r.start, n) for r, _, n in picked]
            states = self._states([r for r, _, _ in picked], 0)
            self._forward(chunks, [t for _, t, _ in picked], states)
            mx.eval(*self.runner.arrays())
            for row, _, n in picked:
                row.start += n

    def _states(self, rows: list[_Row], step: int) -> list[StateChunk] | None:
        """A hybrid draft's state flow in forward ``step``: the catch-up from the slot (zeros
        when it starts over) into the slot; then the drafts through the slot's snapshot."""
        states = self.runner.states
        if states is None:
            return None
        if step == 0:
            return [StateChunk(r.slot if r.start else -1, r.slot) for r in rows]
        scratch = [states.snapshot_of(r.slot) for r in rows]
        return [StateChunk(r.slot if step == 1 else s, s) for r, s in zip(rows, scratch)]

    def _forward(
        self,
        chunks: list[ScheduledChunk],
        tables: list[list[int]],
        states: list[StateChunk] | None,
        fed: mx.array | None = None,
    ) -> mx.array:
        """One packed draft forward; ``fed``: each row's input token, on the device (a draft
        is not on the host yet: the packer leaves its row pending)."""
        for chunk in chunks:
            chunk.samples = True  # a draft's row completes no known sequence, yet is sampled
        block_size, heads = self.runner.block_size, self.runner.head_counts
        long_rope = self.runner.adapter.long_rope_after is not None  # a LongRoPE draft model's
        plan = StepPlan(chunks)
        batch = pack(plan, tables[: len(chunks)], block_size, heads, states, long_rope=long_rope)
        if fed is not None:
            batch.token_ids = fed
        return self.runner.greedy(batch)

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, drafting: Set[str]
    ) -> list[mx.array]:
        return []  # the draft model computes its own hidden states

    def truncated(self, request_id: str, num_tokens: int) -> None:
        truncate_written(self._written.get(request_id), self.kv, num_tokens)

    def forget(self, request_id: str) -> None:
        self._written.pop(request_id, None)
        slot = self._slots.pop(request_id, None)
        if slot is not None and self.runner.slots is not None:
            self.runner.slots.give_back(slot)


def truncate_written(written: Written | None, kv: KVManager, num_tokens: int) -> None:
    """The request's blocks past its first ``num_tokens`` tokens went back to the pool: its
    rows there are no longer held (truncation keeps the block the last token is in)."""
    if written is not None:
        written.valid = min(written.valid, kv.blocks_for(num_tokens) * kv.block_size)


def shared_prefix(a: list[int], b: list[int], most: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``most``."""
    n = min(len(a), len(b), most)
    if a[:n] == b[:n]:  # the common case, compared in C
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
