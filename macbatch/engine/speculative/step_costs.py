"""What a drafted token costs, measured from the engine's own steps: the break-even acceptance
below which a request's drafting loses (docs/speculative.md, "When it speculates").

A drafted token buys ``acceptance`` tokens (the verification's own token comes either way) and
costs its draft forward's share, its verification row and the step's lost overlap. How much
that is against a token of a plain step depends on the device and the batch: on a GPU a few
more rows cost little while a draft model's or an MTP layer's forward costs its weights' reads;
on a CPU every row is real work, so at eight requests a drafted row costs about what the token
it may buy is worth. So it is measured, not set: each step's wall time (from one ``choose`` to
the next) is labelled with the tokens drafted in it and in the step before (a step's device
work finishes in the next one's time, pipelined or not), and per batch size

- a step in which nobody drafted, after one in which nobody drafted, is a plain step's time
  (an exponential moving average);
- every other step's time beyond the plain one is put on its drafted tokens (decaying sums of
  their seconds, their number and their drafts: boundaries between the two kinds of step fall
  out of the sums, and steps with drafts count before a plain one is measured).

``break_even(batch)`` is then the extra seconds per drafted token over the seconds per token of a
plain step: the acceptance a drafted token must reach to pay. Unknown (no plain step measured
at that size yet): None, and the policy keeps its floor. A plain step is measured when requests
rest; where nobody rests, ``wants_plain`` asks for two plain steps once a batch size's first
drafting steps were measured, and again every ``EXPLORE_EVERY`` steps once that is stale (the
first carries the drafting step's work, the second is measured). Where a drafted
token costs more than a token is worth (break-even above 1: no acceptance pays, as on a CPU at
a few requests, where every verified row is real work), ``probe_due`` says when to draft anyway,
once every ``EXPLORE_EVERY`` steps, to measure again.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN_WEIGHT = 0.25  # of the newest plain step in the moving average of its seconds
DRAFT_DECAY = 0.9  # the weight left to older drafting steps at each newer one
EXPLORE_EVERY = 64  # steps between two plain ones, where nobody rests on their own
STALE_AFTER = 4 * EXPLORE_EVERY  # a plain step's time older than this is measured again
# steps with drafts measured at a batch size before its first plain one is taken (a short run
# of eight requests that always draft never rested, and lost x0.59 on this CPU unmeasured)
FIRST_PLAIN_AFTER = 2


@dataclass
class _Size:
    """The measurements at one batch size."""

    plain: float | None = None  # seconds of a plain step
    plain_step: int = -STALE_AFTER  # the step it was last measured at
    # decaying sums over the steps with drafts on them: their seconds, their number and their
    # drafted tokens (the seconds beyond plain ones' are read once a plain step is measured)
    seconds: float = 0.0
    steps: float = 0.0
    drafted: float = 0.0
    drafting_steps: int = 0  # how many were measured (not decayed)


@dataclass
class _Open:
    """The step being run: when it started, its batch size and the tokens drafted in it."""

    start: float
    batch: int
    drafted: int = 0


class StepCosts:
    def __init__(self) -> None:
        self._sizes: dict[int, _Size] = {}
        self._step = 0
        self._open: _Open | None = None
        self._before: _Open | None = None  # the step before it (its device work is in its time)

    def step_started(self, now: float, batch: int | None) -> None:
        """A step starts at ``now`` with ``batch`` requests, all decoding (None: a step not to
        measure, such as one with prefill chunks); closes the step before it."""
        self._step += 1
        closed, before = self._open, self._before
        # measured only between steps of the same batch: a request that joined in the closed
        # step was prefilled in it (and is still prefilling, or decoding now)
        if closed is not None and before is not None and before.batch == closed.batch == batch:
            size = self._sizes.setdefault(closed.batch, _Size())
            self._measure(size, now - closed.start, (before.drafted + closed.drafted) / 2)
        self._before = closed
        self._open = None if batch is None else _Open(now, batch)

    def interrupted(self) -> None:
        """A request finished or left: the step open now is not measured (the engine may go
        idle before the next one, and the batch changes)."""
        self._open = self._before = None

    def drafted(self, tokens: int) -> None:
        """Tokens drafted in the step started last."""
        if self._open is not None:
            self._open.drafted += tokens

    def _measure(self, size: _Size, seconds: float, load: float) -> None:
        """A closed step's ``seconds``, with ``load`` drafted tokens on it (its own and the
        step before's, averaged)."""
        if not load:
            size.plain = seconds if size.plain is None else size.plain
            size.plain += PLAIN_WEIGHT * (seconds - size.plain)
            size.plain_step = self._step
        else:
            size.seconds = DRAFT_DECAY * size.seconds + seconds
            size.steps = DRAFT_DECAY * size.steps + 1
            size.drafted = DRAFT_DECAY * size.drafted + load
            size.drafting_steps += 1

    def break_even(self, batch: int) -> float | None:
        """The acceptance a drafted token must reach to pay at ``batch`` requests (None: not
        measured yet)."""
        size = self._sizes.get(batch)
        if size is None or not size.plain or size.drafted <= 0:
            return None
        extra = size.seconds - size.steps * size.plain
        return max(0.0, extra / size.drafted) / (size.plain / batch)

    def wants_plain(self, batch: int) -> bool:
        """Whether the step starting now should be plain, to measure a plain step at ``batch``:
        at once when steps with drafts were measured there but no plain one yet (two plain
        steps: the first carries the last drafting step's work), and two in a row every
        ``EXPLORE_EVERY`` steps while the last measurement is stale."""
        size = self._sizes.get(batch)
        if size is not None and size.plain is None and size.drafting_steps >= FIRST_PLAIN_AFTER:
            return True
        stale = size is None or self._step - size.plain_step > STALE_AFTER
        return stale and self._step >= EXPLORE_EVERY and self._step % EXPLORE_EVERY < 2

    def probe_due(self) -> bool:
        """Whether the step starting now should draft where drafting was measured to lose at
        any acceptance: once every ``EXPLORE_EVERY`` steps, so that the costs are measured
        again (the machine's load, the requests' lengths change)."""
        return self._step % EXPLORE_EVERY == EXPLORE_EVERY // 2
