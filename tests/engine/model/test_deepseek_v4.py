"""DeepSeek V4 as released (mlx-vlm's ``deepseek_v4``) through the packed step: its attention's
own caches (a rotating window, the compressors' pooling caches, the indexer's) held per request
slot and run per sequence, its hyper-connections, hash-routed and scored MoE over every row.

The oracle is DeepSeek's reference semantics, which mlx-vlm's forward gives in one call over a
whole sequence (every ratio-4 group pooled with its previous group): greedy tokens and
log-probabilities equal that forward's on a tiny random checkpoint in mlx-vlm's layout, with a
window (8) and a top-3 selection that both drop context, and ratio-128 rows past 128 tokens.
mlx-vlm's own generation equals it only until its first group closed after the prompt's first
call (it pools zeros for that group's previous one); where it is exact the engine equals it
too, and the test keeps where it is not; past mlx-vlm's HISA threshold the indexers keep the
reference's flat top-k (docs/engine.md, "DeepSeek V4 as released")."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.utils import load_model

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.held_state import HeldStateGroup
from macbatch.engine.model.families import Library, family, unsupported_reason
from macbatch.engine.stores.held_bytes import FORMAT, payload, rebuild, writable
from macbatch.engine.stores.held_caches import HeldCaches, cache_parts
from tests.support.deepseek_v4 import tiny_v41
from tests.support.disk_tier import conversation_across_a_restart
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import random_prompts, run_staggered
from tests.support.tiny_deepseek_v4 import (
    CONFIG,
    assert_matches_reference,
    reference_greedy,
    reference_logprobs,
    save_deepseek_v4,
)
from tests.support.vlm_oracle import assert_matches_mlx_vlm_text, mlx_vlm_text_greedy

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
# past the window (8), the top-3 of the ratio-4 rows (12 tokens) and one ratio-128 row
LENGTHS = [150, 41, 29, 6, 1, 63]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_deepseek_v4(tmp_path_factory.mktemp("deepseek_v4"))


@pytest.fixture(scope="module")
def served(checkpoint):
    """The tiny checkpoint's engine (a 16-token step budget chunks the long prompts) and
    mlx-vlm's own model of the same files."""
    config = EngineConfig(num_blocks=96, block_size=8, max_num_batched_tokens=16)
    return Engine.load(str(checkpoint), config), load_model(checkpoint)


def test_served() -> None:
    assert unsupported_reason("deepseek_v4") is None
    assert family("deepseek_v4").library is Library.MLX_VLM


def test_staggered_chunked_batch_matches_the_reference(served) -> None:
    """Six requests joining the batch at different steps, the long ones prefilled in chunks
    cut wherever the step budget falls: every token is the reference's."""
    engine, model = served
    prompts = random_prompts(LENGTHS, seed=3)
    results = run_staggered(engine, prompts, GREEDY, join_every=3)
    for i, prompt in enumerate(prompts):
        assert results[i] == reference_greedy(model, prompt, GREEDY.max_tokens), f"request {i}"
    assert_pool_idle(engine)


def test_batched_log_probabilities_and_a_prefix_hit_match_the_reference(served) -> None:
    """Three requests batched, then the longest one's next turn (its prompt, its reply, more
    tokens), which resumes from the caches held at the reply's last block boundary: tokens and
    log-probabilities are the reference's."""
    engine, model = served
    prompts = random_prompts(LENGTHS[:3], seed=5)
    outs = engine.generate(prompts, GREEDY)
    resumed = prompts[0] + outs[0].token_ids + random_prompts([7], seed=6)[0]
    [again] = engine.generate([resumed], GREEDY)
    assert again.metrics is not None and again.metrics.cached_tokens >= 152
    for prompt, out in zip([*prompts, resumed], [*outs, again]):
        assert_matches_reference(model, prompt, out)
    assert_pool_idle(engine)


def test_a_restart_resumes_a_conversation_from_the_disk_tier(checkpoint, served, tmp_path):
    """A conversation's first turns on an engine with a disk cache, closed; a fresh engine over
    the same directory answers its next turn and an edited one from blocks and held caches'
    checkpoints read back from disk (the window's slots, the pooling caches' open and previous
    groups: ``conversation_across_a_restart``): every token and log-probability is the
    reference's."""
    _, model = served
    config = EngineConfig(
        num_blocks=96, block_size=8, max_num_batched_tokens=16, disk_cache_dir=str(tmp_path)
    )
    for prompt, out in conversation_across_a_restart(checkpoint, config, GREEDY, seed=5):
        assert_matches_reference(model, prompt, out)
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("*/namespace.json")]
    assert record["held"][0] == FORMAT  # the namespace names the held caches' format


def test_a_held_checkpoint_rebuilds_only_into_caches_of_its_kind(served) -> None:
    """A checkpoint's payload (``held_bytes.payload``) rebuilt into new caches of the family's
    kind holds every field it had, arrays bit for bit; rebuilt into mlx-lm's V4.1 caches, or
    cut short, it is refused; caches with a field that is neither an array nor a scalar are not
    written (the tier stays off)."""
    engine, _ = served
    engine.generate(random_prompts([29], seed=11), GREEDY)
    group = engine.kv.group(HeldStateGroup)
    assert group is not None
    store = group.slots.store
    assert isinstance(store, HeldCaches) and store.new_caches is not None
    row = store.held[max(store.held)]
    data = np.array(payload(row))
    rebuilt = rebuild(data, store.new_caches())
    assert rebuilt is not None
    pairs = [(a, b) for x, y in zip(row, rebuilt) for a, b in zip(cache_parts(x), cache_parts(y))]
    for was, now in pairs:
        assert type(was) is type(now) and vars(was).keys() == vars(now).keys()
        for name, value in vars(was).items():
            if isinstance(value, mx.array):
                assert np.array_equal(np.array(value), np.array(getattr(now, name))), name
            else:
                assert getattr(now, name) == value, name
    assert rebuild(data, tiny_v41().make_cache()) is None
    assert rebuild(data[:-1], store.new_caches()) is None
    # headers of another shape (the files' checksums hold, the payload is not this format's)
    length = int.from_bytes(data[:8].tobytes(), "little")
    records = json.loads(data[8 : 8 + length].tobytes())
    array_field = next(name for name, _ in records[0]["arrays"].items())
    for broken in (
        [records[0] | {"scalars": None}, *records[1:]],  # no mapping
        [records[0] | {"scalars": records[0]["scalars"] | {"offset": [1]}}, *records[1:]],
        [{**records[0], "arrays": {**records[0]["arrays"], array_field: ["array", [1]]}}],
        [{**records[0], "arrays": {**records[0]["arrays"], array_field: ["float32", [-1]]}}],
    ):
        header = json.dumps(broken + records[len(broken) :]).encode()
        forged = np.concatenate(
            [
                np.frombuffer(len(header).to_bytes(8, "little") + header, np.uint8),
                data[8 + length :],
            ]
        )
        assert rebuild(forged, store.new_caches()) is None
    assert rebuild(data[:5], store.new_caches()) is None
    odd = store.new_caches()
    assert writable(odd)
    cache_parts(odd[0])[0].transaction = {"length": 1}  # neither an array nor a scalar
    assert not writable(odd)


def test_mlx_vlm_own_generation_where_it_is_exact(served) -> None:
    """mlx-vlm prefills all but a prompt's last token in one call, then runs one token a call:
    for prompts one past a group boundary its first three tokens close no group after that call,
    and the engine's equal them; the groups its later calls close pool zeros for their previous
    group, so its later log-probabilities leave the reference's, which the engine keeps."""
    engine, model = served
    prompts = random_prompts([41, 29, 5], seed=7)
    assert all(len(p) % 4 == 1 for p in prompts)
    exact = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, engine.generate(prompts, exact)):
        assert_matches_mlx_vlm_text(model, prompt, out)
    own = mlx_vlm_text_greedy(model, prompts[0], 8)
    tokens = [*prompts[0], *(token for token, _ in own)]
    steps = reference_logprobs(model, tokens[:-1])[len(prompts[0]) - 1 :]
    gaps = [abs(step[token] - lp) for step, (token, lp) in zip(steps, own, strict=True)]
    assert max(gaps[:3]) < 1e-4 < max(gaps[3:])


def test_the_window_and_the_selection_drop_context(served, tmp_path) -> None:
    """The same weights reading every window row, or every ratio-4 row, give another first
    log-probability for the long prompt: the parity above is over attention that drops both."""
    engine, _ = served
    [prompt] = random_prompts(LENGTHS[:1], seed=3)
    [out] = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0, logprobs=0))
    for field in ("sliding_window", "index_topk"):
        assert CONFIG[field] < len(prompt)
        dense = load_model(save_deepseek_v4(tmp_path / field, **{field: 1 << 12}))
        first = reference_logprobs(dense, prompt)[-1][out.token_ids[0]]
        assert abs(first - out.logprobs[0]) > 1e-3, field


def test_preemption_recomputes_the_reference(checkpoint, served) -> None:
    """A pool of 12 blocks for five ~20-token prompts that each reply 24 tokens preempts: a
    preempted request starts its caches again from its first token, and its tokens stay the
    reference's."""
    _, model = served
    config = EngineConfig(num_blocks=12, block_size=8, enable_prefix_caching=False)
    engine = Engine.load(str(checkpoint), config)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = random_prompts([20, 18, 22, 15, 19], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference_greedy(model, prompt, params.max_tokens)
    assert_pool_idle(engine)


def test_the_indexer_takes_the_flat_top_k_where_mlx_vlm_takes_hisa(tmp_path) -> None:
    """A checkpoint whose HISA selection starts at 4 compressed rows (blocks of 2, the best 2;
    mlx-vlm's default starts at 1,024): the engine's tokens and log-probabilities are the
    reference's flat top-k (the same weights with ``index_block`` 0, mlx-vlm's own flat path),
    which mlx-vlm's HISA leaves."""
    path = save_deepseek_v4(tmp_path / "hisa", index_block=2, index_keep=2)
    flat = load_model(save_deepseek_v4(tmp_path / "flat", index_block=0))
    config = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    engine = Engine.load(str(path), config)
    prompts = random_prompts([60, 33], seed=8)
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY)):
        assert_matches_reference(flat, prompt, out)
    hisa = reference_logprobs(load_model(path), prompts[0])
    assert abs(hisa - reference_logprobs(flat, prompts[0])).max() > 1e-3
