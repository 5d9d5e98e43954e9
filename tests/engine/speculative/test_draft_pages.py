"""The draft model runs through macbatch's paged machinery: one packed forward per draft token
over every speculating request, its K/V in the target's KV blocks (counted in the pool's bytes,
grown, truncated, preempted and freed with them). Greedy ids stay mlx-lm's own."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import ARCH_CONFIGS, build_model

PROMPTS = [
    [40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42],
    [90 + (i % 5) for i in range(17)],
    [200, 17, 33, 250, 8, 300, 120, 64, 5],
    [7, 8, 9, 10, 11, 12, 13],
]
MAX_TOKENS = 16
BLOCK = 8


def _engine(model, tokenizer, draft, **config) -> Engine:
    settings = dict(speculative="draft", num_speculative_tokens=4, num_blocks=64, block_size=BLOCK)
    settings.update(config)
    return Engine(model, tokenizer, EngineConfig(**settings), draft_model=draft)


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


def _block_bytes(arch: str, dtype_size: int) -> int:
    """K and V of every layer for one block, from the model's config (float pages)."""
    cfg = ARCH_CONFIGS[arch]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim
    return per_token * BLOCK * dtype_size


@pytest.fixture(scope="module")
def target():
    return build_model("qwen3")


@pytest.fixture(scope="module")
def oracle(target):
    return [mlx_lm_greedy(target, p, MAX_TOKENS) for p in PROMPTS]


def test_speculating_requests_share_each_draft_forward(target, oracle, tiny_tokenizer):
    """Each proposal runs k draft forwards whatever the number of requests: the first packs
    every request's catch-up chunk, the next ones a row per request still drafting."""
    engine = _engine(target, tiny_tokenizer, target)  # the target drafting: every draft holds
    draft = engine.runner.draft
    drafter = engine.speculator.drafter
    forwards: list[int] = []  # sequences packed in each draft forward
    proposals: list[tuple[int, int, int]] = []  # (requests asked, most tokens, forwards run)
    greedy, propose = draft.greedy, drafter.propose

    def counted_greedy(batch):
        forwards.append(int(batch.cu_seqlens_q.size) - 1)
        return greedy(batch)

    def counted_propose(requests, ks):
        before = len(forwards)
        result = propose(requests, ks)
        proposals.append((len(requests), max(ks, default=0), len(forwards) - before))
        return result

    draft.greedy, drafter.propose = counted_greedy, counted_propose
    assert [o.token_ids for o in engine.generate(PROMPTS, _params())] == oracle
    assert all(run == most for _, most, run in proposals)  # k forwards, not k per request
    assert max(asked for asked, _, _ in proposals) == len(PROMPTS)
    assert max(forwards) == len(PROMPTS)  # all four in one forward
    assert engine.stats().speculation.accepted == engine.stats().speculation.drafted > 0


def test_draft_pages_are_counted_and_freed_with_the_targets(target, oracle, tiny_tokenizer):
    """kv_bytes_used and kv_cache_bytes hold both models' pages (sizes from the configs);
    when the requests finish (prefix cache off) nothing is held."""
    draft_model = build_model("llama", seed=3)  # rejects most drafts: truncations too
    engine = _engine(target, tiny_tokenizer, draft_model, enable_prefix_caching=False)
    size = mx.float32.size
    target_bytes, draft_bytes = _block_bytes("qwen3", size), _block_bytes("llama", size)
    assert engine.runner.draft.bytes_per_block == draft_bytes
    seen = 0
    for rid_prompt in PROMPTS:
        engine.add_request(rid_prompt, _params())
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        stats = engine.stats()
        occupied = engine.kv.pool.num_occupied
        assert stats.kv_bytes_used == occupied * (target_bytes + draft_bytes)
        assert stats.draft_kv_bytes == occupied * draft_bytes
        assert stats.kv_cache_bytes == engine.kv.pool.num_blocks * (target_bytes + draft_bytes)
        seen = max(seen, stats.draft_kv_bytes)
    assert seen > 0 and sorted(outputs.values()) == sorted(oracle)
    stats = engine.stats()
    assert stats.kv_bytes_used == stats.draft_kv_bytes == 0
    assert stats.speculation.accepted < stats.speculation.drafted  # rejected drafts rolled back


def test_small_pool_preempts_and_stays_exact(target, oracle, tiny_tokenizer):
    """At 7 blocks of 8 the four requests do not fit together: requests are preempted (their
    draft K/V goes with their blocks) and recomputed, and the ids stay mlx-lm's."""
    engine = _engine(target, tiny_tokenizer, target, num_blocks=7)
    assert [o.token_ids for o in engine.generate(PROMPTS, _params())] == oracle
    assert engine.stats().preemptions > 0
    assert engine.stats().speculation.accepted > 0
    assert_pool_idle(engine)


def test_no_room_for_drafts_means_no_drafts_not_a_preemption(target, tiny_tokenizer):
    """A request whose drafts' positions find no free block does not speculate that step (a
    guess never preempts anyone); it drafts again once blocks are back."""
    engine = _engine(target, tiny_tokenizer, target, pipelined=False, num_blocks=16)
    prompt = PROMPTS[1][:15]  # 2 blocks; its first drafts' positions need a third
    rid = engine.add_request(prompt, _params())
    request = engine._requests[rid]
    engine.step()  # the prompt, and its first token
    hog = engine.kv.pool.num_free
    assert engine.kv.allocate_slots("hog", 0, hog * BLOCK)  # every free block taken
    speculator = engine.speculator
    chosen = speculator.choose(engine.scheduler.running)
    assert chosen == [(request, 2)]  # half the length until its drafts hold (slow start)
    speculator.propose(chosen)
    assert request.drafts == [] and engine.kv.pool.num_free == 0
    speculator.clear(chosen)
    engine.kv.free("hog")
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().preemptions == 0
    assert request.output_token_ids == mlx_lm_greedy(target, prompt, MAX_TOKENS)
    assert engine.stats().speculation.accepted > 0  # it drafted again later


START_MIB = 8 * 2 * 4096 / 2**20  # 8 blocks of both models' pages (4 KiB each)


def test_elastic_pool_grows_and_shrinks_both_models_pages(target, oracle, tiny_tokenizer):
    """An elastic pool resizes the draft's pages with the target's (the same block ids), and
    a shrink keeps the prefix cache's blocks of both: a second run reuses them exactly."""
    engine = _engine(
        target, tiny_tokenizer, target, num_blocks=None, kv_start_mib=START_MIB, max_num_seqs=4
    )
    start = engine.kv.pool.num_blocks
    assert [o.token_ids for o in engine.generate(PROMPTS, _params())] == oracle
    grown = engine.kv.pool.num_blocks
    assert grown > start
    assert engine.runner.draft.store.num_blocks == engine.runner.store.num_blocks == grown
    assert engine.shrink_pool() > 0
    assert engine.runner.draft.store.num_blocks == engine.runner.store.num_blocks == start
    assert [o.token_ids for o in engine.generate(PROMPTS, _params())] == oracle
    assert engine.stats().prefix_cache_hit_rate > 0


def test_hybrid_draft_keeps_its_state_slots_within_max_num_seqs(tiny_tokenizer):
    """A hybrid draft (here the hybrid target drafting for itself: every draft holds) keeps a
    state slot per drafting request until it finishes, never more than max_num_seqs, through
    preemptions (a preempted request's draft state starts over). Greedy ids stay mlx-lm's."""
    model = build_model("qwen3_5")
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    engine = _engine(model, tiny_tokenizer, model, num_blocks=6, max_num_seqs=2)
    slots = engine.runner.draft.slots
    for prompt in PROMPTS:
        engine.add_request(prompt, _params())
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        assert slots.in_use <= 2
        stats = engine.stats()
        held = slots.in_use * 2 * engine.runner.draft.states.bytes_per_slot
        assert (
            stats.draft_kv_bytes
            == engine.kv.pool.num_occupied * engine.runner.draft.bytes_per_block + held
        )
    assert sorted(outputs.values()) == sorted(expected)
    stats = engine.stats()
    assert stats.preemptions > 0
    assert stats.speculation.accepted == stats.speculation.drafted > 0
    assert slots.in_use == 0  # every request finished: its slot given back


def test_idle_shrink_gives_back_a_hybrid_drafts_grown_state_rows(tiny_tokenizer):
    """Eight drafting requests grow a hybrid draft's state slots past their start; once the
    engine is idle, its shrink takes them back to the start size, and a second run (slots
    taken again from fresh rows) keeps mlx-lm's greedy ids."""
    model = build_model("qwen3_5")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS]
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in prompts]
    engine = _engine(model, tiny_tokenizer, model, max_num_seqs=8)
    states = engine.runner.draft.states
    start = states.rows
    assert [o.token_ids for o in engine.generate(prompts, _params())] == expected
    assert states.rows > start  # eight slots and their snapshots
    engine.shrink_pool()
    assert states.rows == start
    assert [o.token_ids for o in engine.generate(prompts, _params())] == expected


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_long_catch_ups_run_in_forwards_within_the_step_budget(arch, tiny_tokenizer):
    """A draft's first catch-up is each request's whole prompt: with a step budget smaller than
    the prompts together, it runs in several draft forwards of at most that many rows (a hybrid
    draft carrying its state in the slot between them), and the greedy ids stay mlx-lm's."""
    model = build_model(arch)
    prompts = [p * 3 for p in PROMPTS]  # 21 to 51 tokens each
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in prompts]
    engine = _engine(model, tiny_tokenizer, model, max_num_batched_tokens=24)
    draft = engine.runner.draft
    sizes: list[int] = []
    greedy = draft.greedy
    draft.greedy = lambda batch: sizes.append(batch.token_ids.size) or greedy(batch)
    assert [o.token_ids for o in engine.generate(prompts, _params())] == expected
    assert max(sizes) <= 24 and sum(s == 24 for s in sizes) >= 2  # split, and full forwards
