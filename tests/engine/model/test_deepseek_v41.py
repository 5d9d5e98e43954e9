"""DeepSeek V4 (mlx-lm's ``deepseek_v41``) through the packed step: its attention's own caches
(window, compressed rows, indexer keys, open group) held per request slot and run per sequence,
its hyper-connections and MoE over every row. Greedy tokens and log-probabilities equal
mlx-lm's own generation on a tiny random checkpoint in the Hugging Face layout, laid out as the
released V4.1 (ratio-2 and ratio-1 rows, a candidate filter), whose window (8) and top-3
selection both drop context (preemption on another tiny config, ratio 4: the every-architecture
test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlx_lm import load as mlx_lm_load

from macbatch.engine import Engine, EngineConfig, SamplingParams, UnsupportedModelError
from macbatch.engine.kv.held_state import HeldStateGroup
from macbatch.engine.model.adapter import ModelAdapter
from macbatch.engine.model.families import unsupported_reason
from macbatch.engine.stores.held_caches import PLACEHOLDER, HeldCaches
from tests.support.deepseek_v4 import V41_CONFIG, save_v41
from tests.support.disk_tier import conversation_across_a_restart
from tests.support.oracle import assert_matches_mlx_lm, assert_pool_idle, mlx_lm_greedy_logprobs
from tests.support.staggered import random_prompts

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0)
LONG = 44  # past the window (8) and the top-3 rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_v41(tmp_path_factory.mktemp("deepseek_v41"))


@pytest.fixture(scope="module")
def served(checkpoint):
    """The tiny checkpoint's engine (a 16-token step budget chunks the long prompts) and mlx-lm's
    own model of the same files."""
    config = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    return Engine.load(str(checkpoint), config), mlx_lm_load(str(checkpoint))[0]


def test_served() -> None:
    assert unsupported_reason("deepseek_v41") is None


def test_batched_chunked_prefill_and_a_prefix_hit_match_mlx_lm(served) -> None:
    """Four requests batched (two prefilled in chunks over several steps), then a prompt that
    extends the longest one and resumes from its cached caches; every token and log-probability
    is mlx-lm's."""
    engine, oracle = served
    prompts = random_prompts([LONG, 5, 27, 1], seed=3)
    outs = engine.generate(prompts, GREEDY)
    resumed = prompts[0] + random_prompts([6], seed=4)[0]
    [again] = engine.generate([resumed], GREEDY)
    assert again.metrics is not None and again.metrics.cached_tokens >= 40
    for prompt, out in zip([*prompts, resumed], [*outs, again]):
        assert_matches_mlx_lm(oracle, prompt, out)
    assert_pool_idle(engine)
    group = engine.kv.group(HeldStateGroup)
    assert group is not None
    store = group.slots.store
    assert isinstance(store, HeldCaches)
    assert group.checkpoints is not None  # only checkpoints still hold caches
    assert set(store.held) <= set(group.checkpoints.most_recent(len(store.held)))
    assert engine.stats().kv_bytes_used == store.held_bytes() > 0


def test_a_restart_resumes_a_conversation_from_the_disk_tier(checkpoint, served, tmp_path):
    """A conversation's first turns on an engine with a disk cache, closed; a fresh engine over
    the same directory answers its next turn and an edited one from blocks and held caches'
    checkpoints read back from disk (``conversation_across_a_restart``): every token and
    log-probability is mlx-lm's."""
    _, oracle = served
    config = EngineConfig(
        num_blocks=64, block_size=8, max_num_batched_tokens=16, disk_cache_dir=str(tmp_path)
    )
    for prompt, out in conversation_across_a_restart(checkpoint, config, GREEDY, seed=5):
        assert_matches_mlx_lm(oracle, prompt, out)


def test_the_window_and_the_selection_drop_context(served, tmp_path) -> None:
    """The same weights reading every window row, or every compressed row, give another first
    log-probability for the long prompt: the parity above is over attention that drops both."""
    engine, _ = served
    [prompt] = random_prompts([LONG], seed=3)
    [out] = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0, logprobs=0))
    wide = {"sliding_window": 1 << 20, "index_topk": 1 << 20}
    for field, value in wide.items():
        assert V41_CONFIG[field] < LONG
        dense = mlx_lm_load(str(save_v41(tmp_path / field, **{field: value})))[0]
        [(_, logprob)] = mlx_lm_greedy_logprobs(dense, prompt, 1)
        assert abs(logprob - out.logprobs[0]) > 1e-3, field


def test_a_config_mlx_lm_gets_wrong_is_refused() -> None:
    """Layer 2 compresses at ratio 8 but reuses layer 1's ratio-4 top-k (mlx-lm gathers past its
    rows: NaN at random), so there is no output to match."""
    from mlx_lm.models import deepseek_v41

    config = dict(
        V41_CONFIG, compress_ratios=[0, 4, 8, 4], kv_source_layer_ids=[1, 2, 3],
        index_source_layer_ids=[1, 3], candidate_source_layer_id=-1,
    )  # fmt: skip
    model = deepseek_v41.Model(deepseek_v41.ModelArgs.from_dict(config))
    with pytest.raises(UnsupportedModelError, match="selects among the ratio-4 rows of layer 1"):
        ModelAdapter(model)


def test_rejected_drafts_resume_from_the_snapshot(checkpoint, served) -> None:
    """Prompt-lookup drafts on a repeating prompt are verified and rejected (the tiny model does
    not repeat it): the step after resumes from the caches after the verification's first token
    (the slot's snapshot), and every token and log-probability is still mlx-lm's."""
    _, oracle = served
    config = EngineConfig(
        num_blocks=64, block_size=8, speculative="ngram", num_speculative_tokens=3
    )
    engine = Engine.load(str(checkpoint), config)
    prompts = [random_prompts([6], seed=1)[0] * 4, random_prompts([20], seed=2)[0] * 2]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, engine.generate(prompts, params)):
        assert_matches_mlx_lm(oracle, prompt, out)
    counts = engine.stats().speculation
    assert counts.verifications > 0 and counts.accepted < counts.drafted
    assert_pool_idle(engine)


def test_doctor_says_the_caches_are_not_paged(checkpoint) -> None:
    from macbatch.engine.model.probe import probe_model

    rows: list[tuple[str, str]] = []
    assert probe_model(checkpoint, rows) is None
    found = dict(rows)
    assert "not paged" in found["layers"]
    assert found["KV bytes/token"].startswith("not counted")


def test_compacting_the_store_moves_the_kept_checkpoints_caches() -> None:
    """``StateSlots.shrink`` compacts the store to fresh slots and the kept checkpoints (renumbered
    after them): the caches they name move with them, the request slots' go."""
    store = HeldCaches([PLACEHOLDER], rows=8)
    for row in (1, 5, 6):
        store.hold(row, [f"caches of row {row}"])
    store.compact(fresh=2, kept=[6, 5])
    assert store.held == {2: ["caches of row 6"], 3: ["caches of row 5"]}
    assert store.rows == 4
