"""Scheduling policy without a model: decodes first, chunked prefill FCFS within the token
budget, preemption of the newest request, and the pipelined step's pending tokens."""

from __future__ import annotations

from macbatch.engine.core.request import Request
from macbatch.engine.core.scheduler import Scheduler, StepPlan
from tests.support.fake_requests import make_request
from tests.support.kv import fixed_kv_manager

BLOCK = 4


def _scheduler(num_blocks: int = 64, budget: int = 16, max_seqs: int = 8) -> Scheduler:
    return Scheduler(fixed_kv_manager(num_blocks, BLOCK, b"root"), budget, max_seqs)


def _run(plan: StepPlan, sampled_token: int = 7) -> None:
    """What the engine does with a plan: compute the chunks, append a token where sampled."""
    for chunk in plan.chunks:
        chunk.request.num_computed_tokens += chunk.num_tokens
        if chunk.samples:
            chunk.request.output_token_ids.append(sampled_token)


def _shape(plan: StepPlan) -> list[tuple[str, int, int]]:
    return [(c.request.request_id, c.start, c.num_tokens) for c in plan.chunks]


def _dispatch_pending(plan: StepPlan) -> None:
    """The pipelined engine's dispatch: computed tokens advance, samples are pending."""
    for chunk in plan.chunks:
        chunk.request.num_computed_tokens += chunk.num_tokens
        chunk.request.num_pending += chunk.samples


def test_decodes_first_then_prompts_in_chunks_fcfs():
    scheduler = _scheduler(budget=10)
    a, b, c = (make_request(n, request_id=i) for n, i in ((6, "a"), (20, "b"), (3, "c")))
    for r in (a, b, c):
        scheduler.add(r)
    plan = scheduler.schedule()
    assert _shape(plan) == [("a", 0, 6), ("b", 0, 4)]  # b is chunked to the budget left
    _run(plan)
    plan = scheduler.schedule()
    # a decodes first; b's prompt goes on; c waits for budget.
    assert _shape(plan) == [("a", 6, 1), ("b", 4, 9)]
    _run(plan)
    assert _shape(scheduler.schedule()) == [("a", 7, 1), ("b", 13, 7), ("c", 0, 2)]


def test_max_num_seqs_caps_what_runs():
    scheduler = _scheduler(max_seqs=2)
    for i in range(3):
        scheduler.add(make_request(2, request_id=f"r{i}"))
    assert [c.request.request_id for c in scheduler.schedule().chunks] == ["r0", "r1"]
    assert [r.request_id for r in scheduler.waiting] == ["r2"]


def test_the_newest_request_is_preempted_when_blocks_run_out():
    scheduler = _scheduler(num_blocks=4, budget=64)
    old, new = make_request(8, request_id="old"), make_request(8, request_id="new")
    scheduler.add(old)
    scheduler.add(new)
    _run(scheduler.schedule())  # 2 blocks each: the pool is full
    plan = scheduler.schedule()
    # old's decode needs a third block: new gives its two back and restarts from scratch with
    # the one block left over.
    assert _shape(plan) == [("old", 8, 1), ("new", 0, 4)]
    assert new.metrics.preemptions == 1 and scheduler.num_preemptions == 1
    assert len(scheduler.kv.block_table("old")) == 3
    assert len(scheduler.kv.block_table("new")) == 1
    assert scheduler.kv.num_free_blocks == 0


def test_a_cached_prompt_prefix_is_not_recomputed():
    scheduler = _scheduler()
    first = make_request(list(range(10, 20)), request_id="first")
    scheduler.add(first)
    plan = scheduler.schedule()
    _run(plan)
    scheduler.kv.cache_full_blocks(first, first.num_computed_tokens)
    second = make_request(list(range(10, 20)) + [1, 2], request_id="second")
    scheduler.add(second)
    assert _shape(scheduler.schedule())[-1] == ("second", 8, 4)


def test_a_pending_token_is_computed_next_step_unless_it_ends_the_request():
    scheduler = _scheduler()
    long, short = make_request(5, max_tokens=4), make_request(5, max_tokens=1)
    scheduler.add(long)
    scheduler.add(short)
    _dispatch_pending(scheduler.schedule())
    assert long.num_tokens == 6 and long.num_known_tokens == 5
    # long decodes its pending token; short's only token ends it, so it has nothing to compute.
    assert _shape(scheduler.schedule()) == [(long.request_id, 5, 1)]


def test_a_request_preempted_with_a_pending_token_waits_for_it():
    scheduler = _scheduler(num_blocks=3, budget=64)
    old, new = make_request(4, request_id="old"), make_request(8, request_id="new")
    scheduler.add(old)
    scheduler.add(new)
    _dispatch_pending(scheduler.schedule())  # pool full; both have a pending token
    plan = scheduler.schedule()  # old needs a block: new is preempted, still pending
    assert _shape(plan) == [("old", 4, 1)]
    assert list(scheduler.waiting) == [new] and new.num_pending == 1
    scheduler.finish(old)  # room again, but new's last token is not known yet
    assert scheduler.schedule().chunks == []
    _read_pending(new, 9)
    assert _shape(scheduler.schedule()) == [("new", 0, 9)]


def _read_pending(request: Request, token: int) -> None:
    request.num_pending -= 1
    request.output_token_ids.append(token)
