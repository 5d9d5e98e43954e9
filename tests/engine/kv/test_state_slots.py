"""A hybrid model's recurrent-state rows are taken on demand: the store starts with a few request
slots and checkpoints, grows (doubling) while more requests run at once or more prefixes are
cached, goes back to its start size when idle (keeping the most recent checkpoints, which later
requests still resume from), and outputs stay mlx-lm's greedy ones throughout. A fixed pool has
every row from the start."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup
from macbatch.engine.kv.state_slots import START_CHECKPOINTS, START_SLOTS
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts
from tests.support.tiny import build_model

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def _rows(engine: Engine) -> int:
    """Rows of the store's first state array, as allocated (not as the store says)."""
    states = engine.runner.states
    assert states is not None
    return states.arrays()[0].shape[0]


def _state(engine: Engine) -> RecurrentStateGroup:
    state = engine.kv.group(RecurrentStateGroup)
    assert state is not None
    return state


def _run(engine: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], set[int], int]:
    """Greedy ids of ``prompts`` run together; the request slot counts seen, the most in use."""
    state = _state(engine)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    outs, sizes, most_used = {}, set(), 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        sizes.add(state.slots.num_slots)
        most_used = max(most_used, state.slots_in_use)
    return [outs[i].token_ids for i in ids], sizes, most_used


def test_slots_grow_under_load_and_shrink_when_idle(tiny_tokenizer):
    model = build_model("falcon_h1")
    config = EngineConfig(block_size=8, max_num_seqs=16, max_num_batched_tokens=96)
    engine = Engine(model, tiny_tokenizer, config)
    states = engine.runner.states
    assert states is not None
    start_rows = START_SLOTS + START_CHECKPOINTS
    assert _rows(engine) == start_rows  # small at start: not max_num_seqs, not the budget

    prompts = random_prompts([12, 30, 7, 21, 3, 16, 9, 25, 14, 5, 11, 19], seed=5)
    expected = [mlx_lm_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    ids, sizes, most_used = _run(engine, prompts)
    assert ids == expected
    assert most_used == 12 and max(sizes) == 16  # doubled 4 -> 8 -> 16, not past the cap
    assert {8, 16} <= sizes

    engine.shrink_pool()
    assert _rows(engine) == start_rows
    again, _, _ = _run(engine, prompts[:6])  # grows again from the start size
    assert again == expected[:6]
    assert_pool_idle(engine)


def test_checkpoints_grow_with_cached_prefixes_and_the_newest_outlive_a_shrink(tiny_tokenizer):
    """Twenty prompts of three blocks each leave more checkpoints than the store starts with:
    it grows past ``START_CHECKPOINTS``. Shrunk when idle, it keeps the newest eight, and a
    prompt extending the last one resumes from its checkpoint with mlx-lm's ids."""
    model = build_model("qwen3_5")
    config = EngineConfig(block_size=8, max_num_seqs=8, max_num_batched_tokens=64)
    engine = Engine(model, tiny_tokenizer, config)
    checkpoints = _state(engine).checkpoints
    assert checkpoints is not None and checkpoints.count == START_CHECKPOINTS
    assert checkpoints.cap > 2 * START_CHECKPOINTS  # a budget well past the start

    prompts = random_prompts([25] * 20, seed=8)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [mlx_lm_greedy(model, p, 10) for p in prompts]
    assert len(checkpoints) > START_CHECKPOINTS and checkpoints.count > START_CHECKPOINTS
    assert _rows(engine) == _state(engine).slots.num_slots + checkpoints.count

    engine.shrink_pool()
    assert len(checkpoints) == START_CHECKPOINTS
    assert _rows(engine) == START_SLOTS + START_CHECKPOINTS
    follow = prompts[-1] + outs[-1].token_ids + random_prompts([6], seed=9)[0]
    [out] = engine.generate([follow], GREEDY)
    assert out.metrics.cached_tokens >= 32  # resumed after the last turn's blocks
    assert out.token_ids == mlx_lm_greedy(model, follow, GREEDY.max_tokens)
    oldest = prompts[0] + random_prompts([6], seed=10)[0]  # its checkpoint made room
    [out] = engine.generate([oldest], GREEDY)
    assert out.token_ids == mlx_lm_greedy(model, oldest, GREEDY.max_tokens)
    assert_pool_idle(engine)


def test_a_fixed_pool_keeps_every_row_from_the_start(tiny_tokenizer):
    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, max_num_seqs=6))
    checkpoints = _state(engine).checkpoints
    assert checkpoints is not None and checkpoints.count == checkpoints.cap
    assert _rows(engine) == 6 + checkpoints.cap
    prompts = random_prompts([9, 4, 13], seed=6)
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
    engine.shrink_pool()
    assert _rows(engine) == 6 + checkpoints.cap
