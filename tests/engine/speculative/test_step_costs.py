"""The break-even acceptance measured from step times (speculative/step_costs.py), against
the cost model the synthetic clock is built from."""

from __future__ import annotations

import pytest

from macbatch.engine.speculative.step_costs import EXPLORE_EVERY, StepCosts


def _run(costs: StepCosts, batch: int, plan: list[int], plain: float, per_draft: float) -> None:
    """Steps at ``batch`` drafting ``plan[i]`` tokens, each step's device work (a plain step's
    ``plain`` seconds plus ``per_draft`` a drafted token) finishing in the next step's time,
    as a pipelined engine's does."""
    now, carried = 0.0, 0.0
    for drafted in plan:
        costs.step_started(now, batch)
        costs.drafted(drafted)
        now += carried
        carried = plain + per_draft * drafted


@pytest.mark.parametrize(("batch", "per_draft"), [(1, 0.01), (4, 0.02), (8, 0.003)])
def test_the_break_even_is_a_drafted_token_s_cost_over_a_plain_token_s(
    batch: int, per_draft: float
) -> None:
    costs = StepCosts()
    plan = ([0, 0, 0] + [4, 4, 2, 3, 0, 4]) * 20
    _run(costs, batch, plan, 0.08, per_draft)
    assert costs.break_even(batch) == pytest.approx(per_draft / (0.08 / batch), rel=0.1)
    assert costs.break_even(batch + 1) is None  # another batch size: not measured


def test_unknown_until_a_plain_step_was_measured() -> None:
    costs = StepCosts()
    _run(costs, 2, [4] * 50, 0.08, 0.01)
    assert costs.break_even(2) is None


def test_steps_of_another_size_or_with_prefill_are_not_measured() -> None:
    costs = StepCosts()
    now = 0.0
    for step in range(40):  # the batch changes every step, or a step is not a pure decode
        costs.step_started(now, None if step % 3 == 0 else 1 + step % 2)
        costs.drafted(4 * (step % 2))
        now += 0.1
    assert costs.break_even(1) is None and costs.break_even(2) is None


def test_plain_steps_are_asked_for_while_none_was_measured() -> None:
    """Eight requests that always draft never rest: without plain steps asked for, drafting
    that loses at that batch size was never measured (x0.59 on the 2-core CPU)."""
    costs = StepCosts()
    asked = []
    for step in range(3 * EXPLORE_EVERY):
        costs.step_started(float(step), 2)
        if costs.wants_plain(2):
            asked.append(step)
        else:
            costs.drafted(4)
    # the steps closed at steps 2 and 3 are the first two drafting ones measured: two plain
    # steps at once, then a plain step is measured (fresh) and none is asked for a while
    assert asked == [3, 4]


def test_a_request_leaving_ends_the_measured_step() -> None:
    """The engine may idle after a request finishes (a client's next request comes later):
    that wait is no step's time."""
    costs = StepCosts()
    plan = ([0, 0, 0] + [4, 4, 2, 3, 0, 4]) * 10
    _run(costs, 2, plan, 0.08, 0.01)
    before = costs.break_even(2)
    costs.interrupted()  # after the last step, its request finishes
    for now in (1030.0, 1030.08, 1030.16):  # the next request's steps, half a minute later
        costs.step_started(now, 2)
    assert costs.break_even(2) == pytest.approx(before)
