"""The batch limit of speculation follows the running requests' measured acceptance
(policy.BATCH_LIMITS, from the sweep in benchmarks/speculative.py)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import ANY

from macbatch.engine.speculative.policy import (
    BATCH_LIMITS,
    FULL_START_AFTER,
    MAX_IDLE_REST,
    MIN_ACCEPTANCE,
    PROBE_SHARE,
    START_SHARE,
    SpeculationPolicy,
)
from macbatch.engine.speculative.step_costs import EXPLORE_EVERY


def _running(n: int) -> list:
    return [SimpleNamespace(request_id=f"r{i}") for i in range(n)]


def test_the_batch_limit_shrinks_as_drafts_are_rejected() -> None:
    policy = SpeculationPolicy(4)
    running = _running(6)
    assert policy.batch_limit(running) == BATCH_LIMITS[0][1]  # nothing verified yet: optimistic
    for request in running:  # every second draft rejected: the moving average falls to ~0.5
        for _ in range(20):
            policy.record(request.request_id, 4, 2)
    assert policy.batch_limit(running) == 8
    for request in running:  # one draft in four accepted
        for _ in range(20):
            policy.record(request.request_id, 4, 1)
    assert policy.batch_limit(running) == 4
    # seven running requests above a limit of four: no one speculates
    assert policy.choose(running + _running(7)[6:]) == []


def test_a_fixed_limit_overrides_the_measured_one() -> None:
    policy = SpeculationPolicy(4)
    policy.max_batch = 1 << 20
    assert policy.batch_limit(_running(64)) == 1 << 20


def _decoding(request_id: str) -> SimpleNamespace:
    """A request past its prefill that may speculate."""
    params = SimpleNamespace(speculative=True, thinking_token_budget=None)
    return SimpleNamespace(
        request_id=request_id, params=params, prompt_token_ids=[1, 2], num_computed_tokens=2
    )


def _lengths(policy: SpeculationPolicy, request, results: list[int]) -> list[int]:
    """The draft length chosen before each verification, which accepts ``results[i]``."""
    lengths = []
    for accepted in results:
        ((_, k),) = policy.choose([request])
        lengths.append(k)
        policy.record(request.request_id, k, min(k, accepted))
    return lengths


def test_a_request_drafts_half_the_length_until_all_its_drafts_hold() -> None:
    decoding = _decoding("r")
    half = int(8 * START_SHARE)
    assert _lengths(SpeculationPolicy(8), decoding, [8, 8, 8]) == [half, 8, 8]
    decoding.request_id = "s"  # a request whose drafts fail stays at half or less
    lengths = _lengths(SpeculationPolicy(8), decoding, [1, 1, 1])
    assert lengths[0] == half and max(lengths) <= half


def test_the_draft_length_doubles_with_each_verification_whose_drafts_all_hold() -> None:
    assert _lengths(SpeculationPolicy(16), _decoding("r"), [16] * 4) == [4, 8, 16, 16]
    assert _lengths(SpeculationPolicy(4), _decoding("r"), [4] * 3) == [2, 4, 4]


def test_a_new_request_starts_at_full_length_once_the_drafter_s_drafts_have_held() -> None:
    """Slow start finds out whether a request's drafts hold; once the drafter's have held on
    this target for ``FULL_START_AFTER`` verifications, a new request drafts the full length at
    once, and a drafter whose drafts then fail slow-starts new requests again."""
    policy = SpeculationPolicy(8)
    half = int(8 * START_SHARE)
    for n in range(FULL_START_AFTER // 2):  # two verifications each, every draft held
        assert _lengths(policy, _decoding(f"r{n}"), [8, 8])[0] == half
    assert _lengths(policy, _decoding("proven"), [8]) == [8]
    _lengths(policy, _decoding("failing"), [0, 0])  # the drafter's record falls below 0.9
    assert _lengths(policy, _decoding("after"), [8]) == [half]


def _speculating_steps(policy: SpeculationPolicy, requests: list, steps: int) -> dict:
    """Step numbers at which each request drafted, every draft rejected."""
    seen: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for step in range(steps):
        for request, k in policy.choose(requests):
            seen[request.request_id].append(step)
            policy.record(request.request_id, k, 0)
    return seen


def test_rests_lengthen_while_every_draft_fails() -> None:
    """A failing request's rests double up to MAX_REST: it speculates in a handful of 300
    steps (resetting the rest after each retry had it speculate in every third step)."""
    steps = _speculating_steps(SpeculationPolicy(8), [_decoding("r")], 300)["r"]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert len(steps) <= 12 and gaps[-1] >= 32, steps


def test_resting_requests_retry_in_the_same_steps() -> None:
    """Every step with a verification in it is synchronous, so the rests of requests that
    started failing at different times end together."""
    policy = SpeculationPolicy(8)
    early, late = _decoding("early"), _decoding("late")
    _speculating_steps(policy, [early], 7)
    seen = _speculating_steps(policy, [early, late], 300)
    assert seen["early"][-3:] == seen["late"][-3:]


def test_nothing_to_propose_rests_briefly_and_leaves_the_acceptance_alone() -> None:
    """No draft wasted no row: the request retries within MAX_IDLE_REST steps however long it
    finds nothing, and the batch limit still reads it as accepting all."""
    policy = SpeculationPolicy(8)
    request = _decoding("r")
    tried = []
    for step in range(200):
        if policy.choose([request]):
            tried.append(step)
            policy.record("r", 0, 0)
    assert max(b - a for a, b in zip(tried, tried[1:])) == MAX_IDLE_REST
    assert len(tried) >= 200 // MAX_IDLE_REST
    assert policy.batch_limit(_running(12)[:1] + [request]) == BATCH_LIMITS[0][1]


def _timed_steps(
    policy: SpeculationPolicy, requests: list, steps: int, seconds_per_draft: float
) -> list[int]:
    """The steps at which anyone drafted, on a clock where a plain step takes 0.1 s and each
    drafted token adds ``seconds_per_draft``; three drafts in four are accepted."""
    now, drafting = 0.0, []
    for step in range(steps):
        chosen = policy.choose(requests, now)
        drafted = sum(k for _, k in chosen)
        policy.drafted(drafted)
        for request, k in chosen:
            policy.record(request.request_id, k, 3 * k // 4)
        if chosen:
            drafting.append(step)
        now += 0.1 + seconds_per_draft * drafted
    return drafting


def test_drafts_costlier_than_what_they_buy_switch_drafting_off() -> None:
    """At two requests a plain step's token is worth 0.05 s: a drafted token costing 0.05 s
    pays only at 100% acceptance, so requests accepting 75% stop drafting (a probe once a
    rest, the rests doubling), where MIN_ACCEPTANCE alone kept them drafting every step."""
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    late = [s for s in _timed_steps(policy, requests, 500, 0.05) if s >= 300]
    assert len(late) <= 8, late
    assert 0.9 < policy.floor < 1.1  # the measured break-even: 0.05 s against 0.05 s a token


def test_cheap_drafts_keep_drafting_at_the_same_acceptance() -> None:
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    late = [s for s in _timed_steps(policy, requests, 500, 0.005) if s >= 300]
    assert len(late) >= 190, len(late)
    assert policy.floor == MIN_ACCEPTANCE  # measured 0.1: the floor is the higher


def test_drafting_resumes_once_drafts_get_cheap_again() -> None:
    """The probes keep measuring: when drafts cost little again (the machine's other load
    went away), the requests' probes pass and their rests shorten back to drafting."""
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    _timed_steps(policy, requests, 400, 0.05)
    late = [s for s in _timed_steps(policy, requests, 3000, 0.0) if s >= 2800]
    assert len(late) >= 150, len(late)


def test_where_no_acceptance_pays_only_a_probe_step_drafts_now_and_then() -> None:
    """A drafted token costing four tokens' worth (0.2 s against 0.05 s) loses even when every
    draft holds: nobody drafts but in one probe step every EXPLORE_EVERY, which measures the
    cost again."""
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    late = [s for s in _timed_steps(policy, requests, 600, 0.2) if s >= 200]
    assert policy.floor > 3
    assert [b - a for a, b in zip(late, late[1:])] == [EXPLORE_EVERY] * (len(late) - 1)
    assert len(late) >= 5


def test_a_new_request_starts_at_the_drafter_s_acceptance_so_far() -> None:
    """After requests whose drafts all failed (an MTP layer that predicts this target badly),
    the next request does not spend its first verifications finding that out: it rests first,
    as long as the last failing request would have rested next, then probes with one draft."""
    policy = SpeculationPolicy(8)
    _speculating_steps(policy, [_decoding("a"), _decoding("b")], 40)
    newcomer = _decoding("c")
    rest = policy.rest
    assert rest >= 16  # doubled in the requests before
    assert policy.choose([newcomer]) == []  # resting from the start
    chosen = [policy.choose([newcomer]) for _ in range(2 * rest)]
    probes = [n for n, c in enumerate(chosen) if c]
    assert chosen[probes[0]] == [(newcomer, 1)]
    # (rests end aligned, so the first may come early; each after is a whole rest away)
    assert len(probes) <= 2 and all(b - a >= rest for a, b in zip(probes, probes[1:])), probes
    fresh = SpeculationPolicy(8)  # with nothing verified yet, a request drafts at once
    assert fresh.choose([_decoding("d")]) == [(ANY, int(8 * START_SHARE))]


def _short_requests(policy: SpeculationPolicy, requests: int, steps: int, cost: float) -> float:
    """``requests`` one after another, ``steps`` decode steps each, every draft rejected, on a
    clock where a plain step takes 0.1 s and a drafted token adds ``cost``: the share of the
    run's time the drafts cost."""
    now, lost = 0.0, 0.0
    for n in range(requests):
        request = _decoding(f"r{n}")
        for _ in range(steps):
            chosen = policy.choose([request], now)
            drafted = sum(k for _, k in chosen)
            policy.drafted(drafted)
            for _, k in chosen:
                policy.record(request.request_id, k, 0)
            lost += cost * drafted
            now += 0.1 + cost * drafted
        policy.forget(request.request_id)
    return lost / now


def test_a_drafter_that_never_predicts_costs_a_few_percent_of_short_requests() -> None:
    """One request at a time, 24 steps each, a drafted token costing half a step and never
    accepted (an MTP layer that predicts the target badly, on a CPU): each new request's rests
    doubled from two steps again, so it probed three or four times (x0.93 on the clock); then
    a failed probe rested until its loss was PROBE_SHARE of the rest (3.4%); now a new request
    also starts from the rest the last one reached (1.3%)."""
    share = _short_requests(SpeculationPolicy(4), 40, 24, 0.05)
    assert share < PROBE_SHARE / 2, share


def test_a_failed_probe_that_cost_nothing_rests_as_briefly_as_before() -> None:
    """Drafts that cost nothing measured lose nothing when they miss: the rests double from two
    steps as before, so a head whose drafts come back is found again soon."""
    policy = SpeculationPolicy(4)
    request = _decoding("r")
    now, drafting = 0.0, []
    for step in range(40):
        chosen = policy.choose([request], now)
        policy.drafted(sum(k for _, k in chosen))
        for _, k in chosen:
            policy.record("r", k, 0)
            drafting.append(step)
        now += 0.1
    assert len(drafting) >= 5, drafting


def test_a_new_request_is_expected_to_draft_at_the_drafter_s_acceptance_so_far() -> None:
    """Before any verification every request is expected to draft (an MTP layer writes its
    prompt's K/V); once the drafter's drafts fail, a new request is not, at any batch size."""
    policy = SpeculationPolicy(8)
    assert policy.drafts_soon(_decoding("new"), 1) and policy.drafts_soon(_decoding("new"), 8)
    good = _decoding("good")
    _lengths(policy, good, [8, 8, 8])  # every draft held
    _speculating_steps(policy, [_decoding("bad")], 300)  # every draft rejected
    assert policy.prior < MIN_ACCEPTANCE
    assert not policy.drafts_soon(_decoding("new"), 1) and not policy.drafts_soon(
        _decoding("bad"), 1
    )
    assert policy.drafts_soon(_decoding("good"), 1)  # its own acceptance, not the drafter's


def test_no_request_is_expected_to_draft_where_no_acceptance_pays() -> None:
    """A drafted token costing four tokens' worth at two requests (as in the test above):
    nobody is expected to draft at two, whatever its acceptance; at three, unmeasured, the
    requests whose drafts mostly held are."""
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    _timed_steps(policy, requests, 300, 0.2)
    assert policy.costs.break_even(2) > 1
    assert not policy.drafts_soon(_decoding("a"), 2) and not policy.drafts_soon(_decoding("new"), 2)
    assert policy.drafts_soon(_decoding("a"), 3) and policy.drafts_soon(_decoding("new"), 3)


def test_a_request_is_expected_to_draft_only_above_the_break_even_at_the_batch_size() -> None:
    """A drafted token costing half a token's worth at two requests (0.025 s against 0.05 s a
    token): its break-even, 0.5, is the floor there; a request accepting 40% of its drafts is
    expected to draft at three requests (unmeasured: MIN_ACCEPTANCE) but not at two."""
    policy = SpeculationPolicy(8)
    requests = [_decoding("a"), _decoding("b")]
    _timed_steps(policy, requests, 300, 0.025)
    assert 0.4 < (policy.costs.break_even(2) or 0) < 0.6
    assert policy.drafts_soon(_decoding("a"), 2)  # three drafts in four held
    for _ in range(6):
        policy.record("c", 5, 2)
    assert not policy.drafts_soon(_decoding("c"), 2) and policy.drafts_soon(_decoding("c"), 3)


def test_a_request_that_never_drafts_is_never_expected_to() -> None:
    """A request with a thinking budget, or one that asked for no speculation, is never chosen,
    so an MTP layer must not run its prompt pass either (whatever the drafter's record)."""
    policy = SpeculationPolicy(8)
    thinking, plain = _decoding("thinking"), _decoding("plain")
    thinking.params = SimpleNamespace(speculative=True, thinking_token_budget=64)
    plain.params = SimpleNamespace(speculative=False, thinking_token_budget=None)
    assert policy.drafts_soon(_decoding("new"), 1)
    assert not policy.drafts_soon(thinking, 1) and not policy.drafts_soon(plain, 1)
    assert policy.choose([thinking, plain]) == []


def test_no_request_is_expected_to_draft_above_the_batch_limit() -> None:
    """Where ``choose`` drafts for nobody (more running requests than the batch limit), nobody
    is expected to draft soon either: an MTP layer keeps no long run of their hidden states."""
    policy = SpeculationPolicy(4)
    requests = [_decoding(f"r{i}") for i in range(10)]
    for request in requests:  # every second draft held: a limit of 8
        for _ in range(20):
            policy.record(request.request_id, 4, 2)
    assert policy.batch_limit(requests) == 8
    assert policy.choose(requests) == [] and policy.drafting_soon(requests, 10) == set()
    assert policy.drafting_soon(requests[:8], 8) == {f"r{i}" for i in range(8)}
