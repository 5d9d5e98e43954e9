"""When to speculate, and how many tokens to draft for each request.

Speculation pays when a step is memory-bound (a few requests: k more rows cost little more than
one) and drafts are accepted; it costs when the batch is large (compute-bound: every drafted row
is a row of real work) or drafts are rejected (wasted rows, and a step that cannot overlap the
host's work with the device's, because drafting needs the previous step's tokens on the host).
So: no step speculates with more running requests than ``BATCH_LIMITS`` allows at their mean
acceptance (measured: part 4 of benchmarks/speculative.py), and each request's draft
length follows its own acceptance (an exponential moving average): full length while most
drafts hold, shorter as fewer do, and none for a while when few hold (rests doubling up to
``MAX_REST`` steps) or the drafter had nothing to propose (up to ``MAX_IDLE_REST``). Rests end
on aligned steps, so requests resting at once retry together. A request starts at
``start_length`` drafts (and again after a rest) and doubles the most it may draft each time a
verification accepts every draft, up to the full length (a slow start): rejected drafts of a
request that turns out to accept few cost rows that never pay, while the moving average takes
a few verifications to fall. Cutting the length to what the last verification accepted
instead cost the draft-model pair at 85% acceptance a quarter of its gain (docs/speculative.md).
Once the drafter's drafts have held on this target (the prior, below), a new request starts at
the full length instead: it has nothing left to find out.

Where drafting stops paying is measured, not guessed (step_costs.py): the engine's steps give
the extra seconds a drafted token costs against a plain step's seconds per token at the same
batch size, which is the acceptance a request's drafts must reach (its break-even; an MTP
layer's or a draft model's forward makes it higher than prompt lookup's free drafts, and a
large batch on a compute-bound device higher still). A request below it (or below
``MIN_ACCEPTANCE``, whichever is higher) rests, and after each rest probes with one
verification, its rests doubling while the probes fail, and never shorter than what keeps a
failed probe's measured loss under ``PROBE_SHARE`` of the steps it rests: a probe's drafts that
miss cost ``break-even - acceptance`` of a token each, so the rest after one is that loss in
plain steps over ``PROBE_SHARE`` (one request at a time, 24 steps each, a drafted token costing
half a step and never accepted: each request's rests doubled from two steps again, three or
four probes a request, 7.9% of the time; now 3.4%, tests/engine/speculative/test_policy.py; a
head that predicts well loses nothing on a probe, so its rests stay the doubling's). A new
request's first rest is the one the last failing request reached (``rest``, back to two steps
once a verification's drafts hold): a drafter that fails on this target probes once in that many
steps across requests, not twice in each short reply (1.3% in that test). At a
batch size where a drafted token costs more than a token is worth (a break-even above 1) nobody
drafts, but for one probe step every ``step_costs.EXPLORE_EVERY`` that measures it again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from macbatch.engine.core.request import Request
from macbatch.engine.parsers.reasoning import Phase
from macbatch.engine.speculative.step_costs import StepCosts

# (mean moving acceptance of the running requests at least, the most running requests that
# speculate): where the batch-size sweep of benchmarks/speculative.py still gained
# (docs/speculative.md, "When it speculates").
BATCH_LIMITS = ((0.9, 12), (0.5, 8), (0.0, 4))
MIN_ACCEPTANCE = 0.3  # below this moving acceptance a request rests from speculating
# from this moving acceptance on, the next rest is short again (not from MIN_ACCEPTANCE: a
# request whose drafts keep failing would rarely rest longer than two steps; measured x0.81 at
# 2 requests and 10% acceptance, docs/speculative.md)
RECOVERED = 0.5
MAX_REST = 64  # steps, after drafts that failed (the doubling's most; a costly probe rests longer)
# the most share of a failing request's steps that its failed probes may cost: rests after a
# failed probe are at least its measured loss over this (docs/speculative.md, "What it costs")
PROBE_SHARE = 0.03
# steps, after the drafter had nothing to propose: no rows were wasted, only the step's overlap
# (a grammar's forced stretch or a reply yet to repeat itself may end; drafting resumes). A
# drafter that never proposes measured within this machine's noise of x1 (part 6 of
# benchmarks/speculative.py: x0.93 to x1.06 at 1 to 4 requests, docs/speculative.md)
MAX_IDLE_REST = 16
EMA_WEIGHT = 0.5  # of the newest verification (0.3 rested a failing request too late)
PRIOR_WEIGHT = 0.2  # of the newest verification, in the acceptance a new request starts at
START_SHARE = 0.5  # of the draft length at the start, and no more than START_TOKENS
START_TOKENS = 4  # (K = 16 starting at 8: x0.82 where K = 8 from 4: x0.94; docs/speculative.md)
# A new request starts at the full length once the drafter's acceptance on this target (the
# prior) is at least FULL_START_PRIOR over at least FULL_START_AFTER verifications: an MTP layer
# that predicts well loses nothing to a slow start there, which cost one request of 24 tokens one
# verification in seven (docs/speculative.md, "Slow start")
FULL_START_PRIOR = 0.9
FULL_START_AFTER = 8


@dataclass
class _Track:
    acceptance: float = 1.0  # a new request's: the drafter's so far (optimistic at first)
    resume: int = 0  # the first step it may speculate at again
    backoff: int = 2  # the next rest's length after failed drafts
    idle_backoff: int = 2  # the next rest's length after no proposal
    limit: int = 1  # the most tokens it may draft now (from the policy's start length)
    probe: bool = False  # it rested: its next chance drafts whatever its acceptance


class SpeculationPolicy:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.start_length = max(1, min(int(max_tokens * START_SHARE), START_TOKENS))
        self._step = 0  # calls of choose: the steps
        self.max_batch: int | None = None  # a fixed limit (the benchmark's sweep lifts it)
        self._tracks: dict[str, _Track] = {}
        self.costs = StepCosts()
        self.floor = MIN_ACCEPTANCE  # the acceptance drafting must reach now (choose sets it)
        # the decode batch size of the step chosen last and its measured break-even (None:
        # unknown), which price a failed probe (``_probe_loss``)
        self._loss: tuple[int | None, float | None] = (None, None)
        # a new request's acceptance: every verification's so far (an MTP layer or a draft
        # model that predicts this target badly does so for the next request too)
        self.prior = 1.0
        self._verifications = 0  # that moved the prior (drafted something)
        # a new request's first rest after failed drafts: the last failing request's next one,
        # so a drafter that fails on this target keeps probing rarely across requests instead
        # of doubling its rests from two steps again in each (a 32-token reply probed twice)
        self.rest = 2

    def choose(
        self, running: Sequence[Request], now: float | None = None
    ) -> list[tuple[Request, int]]:
        """The requests that speculate this step and the most tokens each drafts (called once
        per step: it counts the steps that rests end at). ``now``: the step's start on the
        engine's clock, which measures what drafting costs (None: not measured)."""
        self._step += 1
        batch = None if now is None else _decode_batch(running)
        if now is not None:
            self.costs.step_started(now, batch)
        measured = None if batch is None else self.costs.break_even(batch)
        self.floor = _floor(measured)
        self._loss = (batch, measured)
        if len(running) > self.batch_limit(running):
            return []
        probing = False  # drafting loses at any acceptance, but is measured again
        if batch is not None:
            if self.costs.wants_plain(batch):
                return []
            if self.floor >= 1.0:
                if not self.costs.probe_due():
                    return []
                probing = True
        chosen = []
        for request in running:
            if not may_draft(request):
                continue
            if request.num_computed_tokens < len(request.prompt_token_ids):
                continue  # still prefilling: nothing to draft from this step
            track = self._track(request.request_id)
            if probing:
                chosen.append((request, track.limit))
                continue
            if self._step < track.resume:
                continue
            if track.acceptance < self.floor and not track.probe:
                # below the break-even measured at this batch size: rest, then probe (with the
                # draft length its acceptance gives, one draft where few hold)
                self._rest_failing(track, self._probe_loss(track.acceptance, 1))
                continue
            track.probe = False
            by_acceptance = math.ceil(self.max_tokens * track.acceptance)
            chosen.append((request, max(1, min(by_acceptance, track.limit))))
        return chosen

    def drafts_soon(self, request: Request, batch: int) -> bool:
        """Whether a request is expected to draft soon at ``batch`` running requests: it may
        draft at all (``may_draft``), some acceptance pays there (the break-even measured at
        that size is below 1, or unknown) and its acceptance (its own; a request not decoding
        yet: the drafter's so far) reaches the floor it would face there. An MTP layer skips the
        prompt pass of a request that is not (mtp.py); a probe, or a smaller batch, still
        drafts it, after a longer catch-up."""
        if not may_draft(request):
            return False
        measured = self.costs.break_even(batch)
        if measured is not None and measured >= 1.0:
            return False
        track = self._tracks.get(request.request_id)
        return (self.prior if track is None else track.acceptance) >= _floor(measured)

    def drafting_soon(self, requests: Sequence[Request], batch: int) -> set[str]:
        """The ids of ``requests`` (a step's) expected to draft soon at ``batch`` running
        requests: none above the batch size where steps stop speculating (``batch_limit``),
        else each that ``drafts_soon``."""
        if batch > self.batch_limit(requests):
            return set()
        return {r.request_id for r in requests if self.drafts_soon(r, batch)}

    def drafted(self, tokens: int) -> None:
        """The tokens drafted in this step (what its measured time is put on)."""
        self.costs.drafted(tokens)

    def batch_limit(self, running: Sequence[Request]) -> int:
        """The most running requests at which a step speculates, from their mean acceptance
        (a request not yet verified counts as accepting all)."""
        if self.max_batch is not None:
            return self.max_batch
        tracks = [self._tracks.get(r.request_id) for r in running]
        mean = sum(1.0 if t is None else t.acceptance for t in tracks) / max(1, len(tracks))
        return next(limit for floor, limit in BATCH_LIMITS if mean >= floor)

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """A verification's result (``drafted`` 0: the drafter had nothing to propose, which
        rests the request but says nothing of how its drafts fare)."""
        track = self._track(request_id)
        if not drafted:
            self._rest(track, track.idle_backoff)
            track.idle_backoff = min(2 * track.idle_backoff, MAX_IDLE_REST)
            return
        track.idle_backoff = 2
        track.acceptance += EMA_WEIGHT * (accepted / drafted - track.acceptance)
        self.prior += PRIOR_WEIGHT * (accepted / drafted - self.prior)
        self._verifications += 1
        if accepted == drafted:  # every draft held: it may draft twice as many
            track.limit = min(self.max_tokens, 2 * track.limit)
        if track.acceptance >= self.floor:
            if track.acceptance >= max(RECOVERED, self.floor):
                track.backoff = self.rest = 2
            return
        self._rest_failing(track, self._probe_loss(accepted / drafted, drafted))

    def _probe_loss(self, acceptance: float, drafted: int) -> float:
        """What ``drafted`` tokens accepted at ``acceptance`` lose, in plain steps at the batch
        size measured last (0: unknown, or they pay)."""
        batch, break_even = self._loss
        if batch is None or break_even is None:
            return 0.0
        return drafted * max(0.0, break_even - acceptance) / batch

    def _rest_failing(self, track: _Track, loss: float) -> None:
        """Rest a request whose drafts do not pay, each rest twice the last and at least long
        enough that a probe losing ``loss`` plain steps costs ``PROBE_SHARE`` of them, then
        probe."""
        bounded = math.ceil(loss / PROBE_SHARE)
        self._rest(track, max(track.backoff, 1 << max(0, bounded - 1).bit_length()))
        track.backoff = self.rest = min(2 * track.backoff, MAX_REST)
        track.limit = self.start_length
        track.probe = True

    def _rest(self, track: _Track, steps: int) -> None:
        """Rests end on multiples of their (power-of-two) length, so requests resting at once
        retry in the same steps: every step with a verification in it is synchronous."""
        track.resume = (self._step // steps + 1) * steps

    def forget(self, request_id: str) -> None:
        self._tracks.pop(request_id, None)
        self.costs.interrupted()

    def _track(self, request_id: str) -> _Track:
        track = self._tracks.get(request_id)
        if track is None:
            limit = self._new_request_limit()
            track = _Track(acceptance=self.prior, backoff=self.rest, limit=limit)
            self._tracks[request_id] = track
        return track

    def _new_request_limit(self) -> int:
        """A new request's most drafts: the full length where the drafter's drafts have held on
        this target so far, else the slow start's."""
        proven = self._verifications >= FULL_START_AFTER and self.prior >= FULL_START_PRIOR
        return self.max_tokens if proven else self.start_length


def may_draft(request: Request) -> bool:
    """Whether a request drafts at all: it asked for speculation (a job's row may not) and has
    no thinking budget (whose forced end is not drafted through)."""
    return bool(request.params.speculative) and request.params.thinking_token_budget is None


def _floor(break_even: float | None) -> float:
    """The acceptance a request's drafts must reach at a batch size whose measured break-even
    is ``break_even`` (None: not measured)."""
    return max(MIN_ACCEPTANCE, break_even or 0.0)


def _decode_batch(running: Sequence[Request]) -> int | None:
    """The batch size of a step whose time measures decoding (every running request past its
    prompt), else None."""
    if not running or any(r.num_computed_tokens < len(r.prompt_token_ids) for r in running):
        return None
    return len(running)


def draft_budget(request: Request, k: int) -> int:
    """How many tokens ``request`` may draft now: none unless it is decoding with every token
    on the host and nothing forces its next tokens (a grammar only once the reasoning is over:
    its header and phase changes are not drafted through), and never past ``max_tokens``."""
    if request.finished or request.num_pending or request.num_tokens_to_compute != 1:
        return 0
    state = request.constraint
    if state is not None:
        if request.reasoning is not None and request.reasoning.phase is not Phase.ANSWER:
            return 0
        first = request.num_generated
        if any(state.forced_token(n) is not None for n in range(first, first + k + 1)):
            return 0
    return max(0, min(k, request.max_tokens - request.num_generated - 1))
