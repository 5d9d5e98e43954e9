"""The engine's side of speculative decoding: pick who speculates, draft, hand the sampler its
rows, emit each verified run and roll back the rest (verify.py's rules), and count what was
accepted. Packing the chunks and running the step stay the engine's."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from macbatch.engine.core.outputs import SpeculationCounts
from macbatch.engine.core.request import Request
from macbatch.engine.core.scheduler import ScheduledChunk
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup
from macbatch.engine.sample.sampler import HostSamples
from macbatch.engine.speculative.policy import SpeculationPolicy, draft_budget
from macbatch.engine.speculative.protocol import Drafter
from macbatch.engine.speculative.verify import DraftRow, draft_rows, emitted_rows


class Speculator:
    def __init__(
        self, drafter: Drafter, max_tokens: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.drafter = drafter
        self._clock = clock  # measures the steps: what a drafted token costs (step_costs.py)
        self.policy = SpeculationPolicy(max_tokens)
        self.counts = SpeculationCounts()
        self._rows: dict[str, list[DraftRow]] = {}

    def choose(self, running: Sequence[Request]) -> list[tuple[Request, int]]:
        """Who may speculate this step (decided before the step in flight is read)."""
        return self.policy.choose(running, self._clock())

    def propose(self, chosen: list[tuple[Request, int]]) -> None:
        """Draft for the chosen requests (their tokens now all on the host): sets each one's
        ``drafts`` and sampler rows; a drafter with nothing to propose counts as a rejection
        (the policy rests the request)."""
        budgets = [(r, draft_budget(r, k)) for r, k in chosen]
        asking = [(r, k) for r, k in budgets if k > 0]
        proposals = self.drafter.propose([r for r, _ in asking], [k for _, k in asking])
        for (request, _), drafts in zip(asking, proposals):
            request.drafts, self._rows[request.request_id] = draft_rows(request, drafts)
            if not request.drafts:
                self.policy.record(request.request_id, 0, 0)
        self.policy.drafted(sum(len(r.drafts) for r, _ in asking))

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, batch: int
    ) -> list[mx.array]:
        """Hand the drafter a step's hidden states (an MTP drafter reads them) and which of its
        requests are expected to draft soon at ``batch`` running requests (prefilling ones
        included); returns what to evaluate with the step."""
        drafting = self.policy.drafting_soon([c.request for c in chunks], batch)
        return self.drafter.observe(chunks, hidden, drafting)

    def rows(self, request: Request, num_drafts: int) -> list[Request | DraftRow]:
        """The sampler's rows of a request's chunk: the request, then one per draft verified."""
        return [request, *self._rows.get(request.request_id, [])[:num_drafts]]

    def clear(self, chosen: list[tuple[Request, int]]) -> None:
        """After the step's dispatch: its drafts were verified in it, or not scheduled."""
        for request, _ in chosen:
            request.drafts = []
        self._rows.clear()

    def verify(
        self,
        request: Request,
        drafts: list[int],
        results: HostSamples,
        first: int,
        now: float,
        kv: KVManager,
    ) -> int:
        """Emit a verification's run (rows ``first..``; verify.py: the drafts its samples agree
        with, then the first sample that differs or the bonus one) up to a stop; then book the
        accepted drafts as computed and give back the rejected ones' slots. Returns the tokens
        recorded."""
        count = emitted_rows(drafts, results.tokens[first : first + len(drafts) + 1])
        recorded = 0
        for j in range(first, first + count):
            token, logprob, top = results.row(j, request.params.logprobs)
            recorded += request.append_token(token, now, logprob, top)
            if request.finished:
                break
        accepted = count - 1
        self.record(request, len(drafts), accepted)
        if request.finished:
            return recorded
        state = kv.group(RecurrentStateGroup) if accepted < len(drafts) else None
        if state is not None:
            # The recurrent state went on through the rejected drafts: the next chunk starts
            # from the snapshot after the last known token and recomputes the accepted drafts.
            state.resume_from_snapshot(request.request_id)
            accepted = 0
        request.num_computed_tokens += accepted
        kv.cache_full_blocks(request, request.num_computed_tokens)
        kv.truncate(request.request_id, request.num_computed_tokens)
        self.drafter.truncated(request.request_id, request.num_computed_tokens)
        return recorded

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        self.counts.add(drafted, accepted)
        request.metrics.speculation.add(drafted, accepted)
        self.policy.record(request.request_id, drafted, accepted)

    def forget(self, request: Request) -> None:
        request.drafts = []
        self._rows.pop(request.request_id, None)
        self.policy.forget(request.request_id)
        self.drafter.forget(request.request_id)
