"""MTP drafting: the checkpoint's own multi-token-prediction layer proposes the next tokens from
the target's hidden states, one packed forward per draft token over every request that
speculates (docs/speculative.md, "MTP").

Position ``i`` of the MTP layer reads the target's hidden state at ``i`` (what predicted token
``i + 1``) and the embedding of token ``i + 1``, and predicts token ``i + 2``. So when a request
holds tokens ``0..n-1`` (the last one not yet run by the target), the target's hidden states
``0..n-2`` are known: the first forward catches the MTP layer's K/V up to position ``n - 2`` and
its last row drafts token ``n``; each next draft runs one row at the next position, fed the
previous draft and the MTP layer's own output in place of the target's hidden state (the target
has not run there yet). Those draft rows' K/V are written again from the target's hidden
states at the next catch-up.

The target's hidden states come from the step that computed them (``observe``): a prompt chunk's
MTP K/V is written in that same step (its rows' next tokens are the prompt's), and a decode's
rows are kept, per request, until a proposal's catch-up reads them (at most ``MAX_KEPT`` rows,
``IDLE_KEPT`` for a request not expected to draft soon: a request that does not draft for a long
time drops its oldest, whose MTP K/V is then never written, which only weakens its drafts). A
prompt chunk of a request the policy does not expect to draft soon
(``SpeculationPolicy.drafting_soon``: a layer whose drafts fail, or a batch size where no
acceptance pays or none speculates) is neither written nor kept: that pass would cost every step
it runs in and pay only if the request drafts, and when it does (a probe, a batch that shrank)
its catch-up starts at the first row kept after it. A position whose MTP K/V was so skipped, or
whose hidden state the request never computed (a prefix-cache hit), keeps whatever K/V its block
holds: the rows a request that computed the block wrote, or stale ones. Drafts are greedy (a
point mass: verify.py), so what the MTP layer attends to changes how many drafts hold, never the
output."""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import mlx.core as mx

from macbatch.engine.core.packing import pack
from macbatch.engine.core.scheduler import ScheduledChunk, StepPlan
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.speculative.draft_model import Written, shared_prefix, truncate_written
from macbatch.engine.speculative.eagle3_runner import Eagle3Runner
from macbatch.engine.speculative.mtp_runner import MtpRunner
from macbatch.engine.speculative.policy import may_draft

if TYPE_CHECKING:
    from macbatch.engine.core.request import Request

# the most hidden-state rows kept per request until a catch-up reads them (prompt rows are
# written at once: these are a decode's, one per step, of a request that does not draft)
MAX_KEPT = 4096
# ... and of a request not expected to draft soon (drafts that fail, a batch too large to
# speculate): its catch-up, if it drafts after all, starts this far back. Every kept row holds
# its step's whole copy of the hidden states alive: at 4096 rows, 32 idle requests of a
# 5,120-wide bf16 model would keep 1.3 GB outside the pool's budget (and sum lists of 4,096
# segments every step).
IDLE_KEPT = 32


@dataclass
class _Segment:
    start: int  # the position of its first row
    rows: mx.array  # [m, 1, H], the target's hidden states at start..start+m-1

    @property
    def end(self) -> int:
        return self.start + self.rows.shape[0]


@dataclass
class _Row:
    index: int  # in the proposal's requests
    request: Request
    k: int
    tokens: list[int]
    start: int  # the first position whose MTP K/V is computed now (the catch-up's)
    hidden: list[_Segment]  # the target's hidden states at start..len(tokens)-2


class MtpDrafter:
    def __init__(self, runner: MtpRunner | Eagle3Runner, kv: KVManager) -> None:
        """``runner``: an MTP layer's, or an Eagle-3 drafter's (which drafts the same way)."""
        self.runner = runner
        self.kv = kv
        self._hidden: dict[str, list[_Segment]] = {}
        # the MTP K/V each request's blocks hold (position i read the tokens up to i + 1)
        self._written: dict[str, Written] = {}

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, drafting: Set[str]
    ) -> list[mx.array]:
        """Keep the target's hidden states ``[N, 1, H]`` of a step's chunks (their rows in
        order) for the requests that may speculate, and write the prompt chunks' MTP K/V; a
        prompt chunk of a request not in ``drafting`` (not expected to draft soon) is skipped.
        Returns the arrays to evaluate with the step."""
        index: list[int] = []
        wanted: list[tuple[ScheduledChunk, int]] = []
        row = 0
        for chunk in chunks:
            request = chunk.request
            if may_draft(request) and request.pooling is None:
                segments = self._hidden.setdefault(request.request_id, [])
                _cut(segments, chunk.start)  # the rows from there on are computed again now
                if request.request_id in drafting or not _prompt_pass(chunk):
                    wanted.append((chunk, len(index)))
                    index.extend(range(row, row + chunk.num_tokens))
            row += chunk.num_tokens
        if not index:
            return []
        kept = hidden[mx.array(index)]  # a copy: the step's own rows are not held
        for chunk, at in wanted:
            request_id = chunk.request.request_id
            segments = self._hidden[request_id]
            segments.append(_Segment(chunk.start, kept[at : at + chunk.num_tokens]))
            _keep_last(segments, MAX_KEPT if request_id in drafting else IDLE_KEPT)
        return [kept, *self._write_prompt_rows([c for c, _ in wanted])]

    def _write_prompt_rows(self, chunks: list[ScheduledChunk]) -> list[mx.array]:
        """Prompt chunks' MTP K/V, written in the step that computes their hidden states (the
        next token of each row is the prompt's, but a completing chunk's last row's): a long
        prompt's hidden rows are not held until the first proposal, and the proposal's catch-up
        is one or two rows. Returns the MTP pages to evaluate with the step (none: nothing)."""
        spans: list[tuple[_Row, int, int]] = []
        tables = []
        for chunk in chunks:
            if not _written_at_once(chunk):
                continue
            request = chunk.request
            tokens = request.all_token_ids
            last = min(chunk.start + chunk.num_tokens, len(tokens) - 1) - 1
            hidden = self._covering(request.request_id, self._start(request, tokens), last)
            if not hidden:
                continue
            row = _Row(0, request, 0, tokens, hidden[0].start, hidden)
            spans.append((row, row.start, last + 1 - row.start))
            tables.append(self.kv.block_table(request.request_id))
            preemptions = request.metrics.preemptions
            held = tokens[: last + 2]
            self._written[request.request_id] = Written(held, last + 1, preemptions, len(held))
        if not spans:
            return []
        self._forward(spans, tables)
        for row, _, n in spans:
            _cut_before(self._hidden[row.request.request_id], row.start + n)
        return self.runner.arrays()

    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in requests]
        rows = self._reserve(requests, ks)
        if not rows:
            return proposals
        for row, drafts in zip(rows, self._run(rows)):
            proposals[row.index] = drafts
            request = row.request
            last = len(row.tokens) - 1  # the MTP K/V is the target's up to here (excluded)
            preemptions = request.metrics.preemptions
            written = Written(row.tokens, last, preemptions, known=len(row.tokens))
            self._written[request.request_id] = written
            _cut_before(self._hidden[request.request_id], last)
        return proposals

    def _reserve(self, requests: Sequence[Request], ks: Sequence[int]) -> list[_Row]:
        """The requests whose drafts' positions got blocks and whose hidden states reach their
        last known position, longest drafts first (each later forward's rows are a prefix of
        the one before)."""
        rows = []
        for index, (request, k) in enumerate(zip(requests, ks)):
            tokens = request.all_token_ids
            last = len(tokens) - 2  # the last position whose target hidden state is known
            hidden = self._covering(request.request_id, self._start(request, tokens), last)
            if hidden and self.kv.allocate_slots(request.request_id, len(tokens) - 1, k):
                rows.append(_Row(index, request, k, tokens, hidden[0].start, hidden))
        rows.sort(key=lambda r: -r.k)
        return rows

    def _start(self, request: Request, tokens: list[int]) -> int:
        """The first position whose MTP K/V the request's blocks do not hold (its inputs, the
        tokens up to the next one, changed or were never run)."""
        written = self._written.get(request.request_id)
        if written is None or written.preemptions != request.metrics.preemptions:
            return 0
        same = shared_prefix(written.tokens, tokens, len(tokens))
        return max(0, min(written.valid, same - 1))

    def _covering(self, request_id: str, start: int, last: int) -> list[_Segment]:
        """The kept hidden states from ``start`` (or the first position after it they reach
        without a gap) to ``last``, as segments; empty when ``last`` is not kept."""
        pieces: list[_Segment] = []
        end = last + 1
        for segment in reversed(self._hidden.get(request_id, [])):
            if segment.start >= end:
                continue
            if segment.end < end or end <= start:
                break
            first = max(segment.start, start)
            rows = segment.rows[first - segment.start : end - segment.start]
            pieces.append(_Segment(first, rows))
            end = first
        return pieces[::-1]

    def _run(self, rows: list[_Row]) -> list[list[int]]:
        """k forwards over every row (the first: catch-up chunks; then one draft each), read
        back once."""
        tables = [self.kv.block_table(r.request.request_id) for r in rows]
        self._catch_up(rows, tables)
        spans = [(r, r.start, len(r.tokens) - 1 - r.start) for r in rows]
        hidden, token = self._forward(spans, tables)
        steps = [token]
        for j in range(1, rows[0].k):
            live = [r for r in rows if r.k > j]
            chunks = [ScheduledChunk(r.request, len(r.tokens) - 2 + j, 1) for r in live]
            batch = self._pack(chunks, tables)
            batch.token_ids = steps[-1][: len(live)]
            hidden, token = self.runner.step(batch, hidden[: len(live)])
            steps.append(token)
        mx.eval(*steps, *self.runner.arrays())
        tokens = [cast(list[int], s.tolist()) for s in steps]
        return [[tokens[j][i] for j in range(r.k)] for i, r in enumerate(rows)]

    def _catch_up(self, rows: list[_Row], tables: list[list[int]]) -> None:
        """Catch-up chunks longer than a step's budget (a new request's whole prompt) run first
        in forwards of at most ``max_num_batched_tokens`` rows, each evaluated, as the target's
        prefill is chunked; each row's last position is left for the first sampled forward."""
        budget = self.runner.max_rows
        while sum(len(r.tokens) - 1 - r.start for r in rows) > budget:
            picked: list[tuple[_Row, int, int]] = []
            room = budget
            for row in rows:
                n = min(room, len(row.tokens) - 2 - row.start)
                if n > 0:
                    picked.append((row, row.start, n))
                    room -= n
            if not picked:  # more rows of one position each than the budget: nothing to split
                return
            used = [tables[rows.index(r)] for r, _, _ in picked]
            self._forward(picked, used)
            mx.eval(*self.runner.arrays())
            for row, _, n in picked:
                row.start += n

    def _forward(
        self, spans: list[tuple[_Row, int, int]], tables: list[list[int]]
    ) -> tuple[mx.array, mx.array]:
        """One packed MTP forward over positions ``start..start+n-1`` of each row: the next
        tokens and the target's hidden states there."""
        chunks = [ScheduledChunk(r.request, start, n) for r, start, n in spans]
        batch = self._pack(chunks, tables)
        batch.token_ids = mx.array(
            [t for r, start, n in spans for t in r.tokens[start + 1 : start + 1 + n]],
            dtype=mx.int32,
        )
        hidden = mx.concatenate([_rows(r.hidden, start, n) for r, start, n in spans])
        return self.runner.step(batch, hidden)

    def _pack(self, chunks: list[ScheduledChunk], tables: list[list[int]]) -> PackedBatch:
        for chunk in chunks:
            chunk.samples = True  # an MTP row completes no known sequence, yet is sampled
        runner = self.runner
        return pack(StepPlan(chunks), tables[: len(chunks)], runner.block_size, runner.head_counts)

    def truncated(self, request_id: str, num_tokens: int) -> None:
        truncate_written(self._written.get(request_id), self.kv, num_tokens)

    def forget(self, request_id: str) -> None:
        self._written.pop(request_id, None)
        self._hidden.pop(request_id, None)


def _written_at_once(chunk: ScheduledChunk) -> bool:
    """Whether a chunk's MTP K/V is written in its own step (``_write_prompt_rows``): a prompt
    chunk, or tokens computed again (a preempted request's, a hybrid's accepted drafts after a
    rejection); not a decode's one row nor a verification's."""
    return chunk.num_tokens >= 2 and not chunk.num_drafts


def _prompt_pass(chunk: ScheduledChunk) -> bool:
    """Whether a chunk's MTP K/V would be its prompt's pass, which a request not expected to
    draft soon skips (a hybrid's accepted drafts computed again are a drafting request's, and
    few)."""
    return _written_at_once(chunk) and chunk.start < len(chunk.request.prompt_token_ids)


def _rows(segments: list[_Segment], start: int, n: int) -> mx.array:
    """The hidden states at positions ``start..start+n-1`` from contiguous ``segments``."""
    parts = []
    for segment in segments:
        first, end = max(segment.start, start), min(segment.end, start + n)
        if first < end:
            parts.append(segment.rows[first - segment.start : end - segment.start])
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)


def _cut(segments: list[_Segment], position: int) -> None:
    """Drop the rows at ``position`` and after."""
    while segments and segments[-1].start >= position:
        segments.pop()
    if segments and segments[-1].end > position:
        last = segments[-1]
        segments[-1] = _Segment(last.start, last.rows[: position - last.start])


def _keep_last(segments: list[_Segment], limit: int) -> None:
    """Drop the first segments while more than ``limit`` rows are kept (never the last)."""
    kept = sum(s.rows.shape[0] for s in segments)
    while kept > limit and len(segments) > 1:
        kept -= segments.pop(0).rows.shape[0]


def _cut_before(segments: list[_Segment], position: int) -> None:
    """Drop the rows before ``position`` (their MTP K/V is written)."""
    while segments and segments[0].end <= position:
        segments.pop(0)
    if segments and segments[0].start < position:
        first = segments[0]
        segments[0] = _Segment(position, first.rows[position - first.start :])
