"""A hybrid model's recurrent-state slots are taken on demand: the store starts with a few,
grows (doubling) while more requests run at once, goes back to its start size when idle, and
outputs stay mlx-lm's greedy ones throughout. A fixed pool keeps ``max_num_seqs`` slots."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.state_slots import START_SLOTS
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts
from tests.support.tiny import build_model

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def _rows(engine: Engine) -> int:
    """Rows of the store's first state array, as allocated (not as the store says)."""
    states = engine.runner.states
    assert states is not None
    return states.arrays()[0].shape[0]


def test_slots_grow_under_load_and_shrink_when_idle(tiny_tokenizer):
    model = build_model("falcon_h1")
    config = EngineConfig(block_size=8, max_num_seqs=16, max_num_batched_tokens=96)
    engine = Engine(model, tiny_tokenizer, config)
    states = engine.runner.states
    assert states is not None
    checkpoints = states.num_checkpoints
    assert _rows(engine) == checkpoints + START_SLOTS  # small at start: not max_num_seqs
    start_bytes = sum(a.nbytes for a in states.arrays())

    prompts = random_prompts([12, 30, 7, 21, 3, 16, 9, 25, 14, 5, 11, 19], seed=5)
    expected = [mlx_lm_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    outs, sizes, most_used = {}, set(), 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        sizes.add(_rows(engine) - checkpoints)
        most_used = max(most_used, engine.kv.state_slots_in_use)
    assert [outs[i].token_ids for i in ids] == expected
    assert most_used == 12 and sorted(sizes)[-1] == 16  # doubled 4 -> 8 -> 16, not past the cap
    assert {8, 16} <= sizes

    engine.shrink_pool()
    assert _rows(engine) == checkpoints + START_SLOTS
    assert sum(a.nbytes for a in states.arrays()) == start_bytes
    again = engine.generate(prompts[:6], GREEDY)  # grows again from the start size
    assert [o.token_ids for o in again] == expected[:6]
    assert_pool_idle(engine)


def test_a_fixed_pool_keeps_a_slot_per_sequence(tiny_tokenizer):
    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, max_num_seqs=6))
    states = engine.runner.states
    assert states is not None and _rows(engine) == states.num_checkpoints + 6
    prompts = random_prompts([9, 4, 13], seed=6)
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
    assert _rows(engine) == states.num_checkpoints + 6
