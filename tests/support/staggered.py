"""Requests that join a running batch at different steps, and random prompts for them: the
workload the parity tests hold the engine to against mlx-lm's single-request generation."""

from __future__ import annotations

import numpy as np

from macbatch.engine import Engine, RequestOutput, SamplingParams
from tests.support.tiny import VOCAB_SIZE

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in lengths]


def run_staggered(engine: Engine, prompts, params, join_every: int = 2) -> dict[int, list[int]]:
    """Add request i after i * join_every steps, so requests join a batch already running."""
    outs = run_staggered_outputs(engine, prompts, params, join_every)
    return {i: out.token_ids for i, out in outs.items()}


def run_staggered_outputs(
    engine: Engine, prompts, params, join_every: int = 2
) -> dict[int, RequestOutput]:
    """``run_staggered``'s requests, each one's whole final output (its log-probabilities
    too, where ``params`` asks for them)."""
    results: dict[int, RequestOutput] = {}
    ids: dict[str, int] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished():
        while pending and step >= pending[0][0] * join_every:
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, params)] = i
        for out in engine.step():
            if out.finished:
                results[ids[out.request_id]] = out
        step += 1
    return results


def assert_preemption_recomputes_identically(model, tokenizer, **config: object) -> None:
    """A pool of 12 blocks for five ~20-token prompts that each reply 24 tokens forces
    preemption; every request's tokens are still mlx-lm's (``config``: more engine settings)."""
    from macbatch.engine import EngineConfig
    from tests.support.oracle import assert_pool_idle, mlx_lm_greedy

    settings: dict[str, object] = dict(
        num_blocks=12, block_size=8, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    engine = Engine(model, tokenizer, EngineConfig(**{**settings, **config}))  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = random_prompts([20, 18, 22, 15, 19], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens)
    assert_pool_idle(engine)


def assert_loading_matches_mlx_lm(folder, arch: str, quantized: bool, group_size: int) -> None:
    """``Engine.load`` of a tiny ``arch`` checkpoint saved in ``folder`` (and of mlx-lm's own
    4-bit conversion of it, groups of ``group_size``) gives the tokens of ``mlx_lm.load`` +
    ``generate_step`` on the same files."""
    from mlx_lm import convert
    from mlx_lm import load as mlx_lm_load

    from macbatch.engine import EngineConfig
    from tests.support.oracle import mlx_lm_greedy
    from tests.support.tiny import save_model

    path = save_model(folder / "float", arch=arch)
    if quantized:
        convert(str(path), str(folder / "q4"), quantize=True, q_bits=4, q_group_size=group_size)
        path = folder / "q4"
    model, _ = mlx_lm_load(str(path))
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, max_num_batched_tokens=32))
    prompts = random_prompts([7, 45, 3], seed=2)
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)


# the staggered workload's engine: a 24-token budget chunks the longer prompts over steps
STAGGERED = dict(num_blocks=96, block_size=8, max_num_batched_tokens=24)


def assert_staggered_batch_matches_mlx_lm(engine: Engine, model) -> None:
    """Nine requests of different lengths (some longer than the step budget) join ``engine``
    at different steps; each one's tokens are mlx-lm's own for ``model``."""
    from tests.support.oracle import assert_pool_idle, mlx_lm_greedy

    prompts = random_prompts([1, 5, 37, 12, 3, 60, 8, 25, 2])
    results = run_staggered(engine, prompts, GREEDY)
    for i, prompt in enumerate(prompts):
        assert results[i] == mlx_lm_greedy(model, prompt, GREEDY.max_tokens), f"request {i}"
    assert_pool_idle(engine)


def assert_restart_reads_the_prefix_from_disk(
    model, tokenizer, folder, kv_bits: int | None, kv_group_size: int = 32,
    indexer_keys: str | None = None,
) -> None:  # fmt: skip
    """A 70-token prompt's blocks go to the disk tier in ``folder``; a fresh engine reads its
    64 tokens of full blocks back for a longer prompt and its tokens stay mlx-lm's (over its
    own caches rounded through the page format when ``kv_bits`` or ``indexer_keys`` is set)."""
    from macbatch.engine import EngineConfig
    from tests.support.oracle import mlx_lm_greedy

    config = EngineConfig(
        num_blocks=64,
        block_size=8,
        disk_cache_dir=str(folder),
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        indexer_keys=indexer_keys,
    )
    prompt = random_prompts([70], seed=1)[0]
    first = Engine(model, tokenizer, config)
    first.generate([prompt], GREEDY)
    first.close()
    engine = Engine(model, tokenizer, config)
    [out] = engine.generate([prompt + [5, 6, 7]], GREEDY)
    assert out.metrics.disk_cached_tokens == 64
    expected = mlx_lm_greedy(
        model, prompt + [5, 6, 7], GREEDY.max_tokens, kv_bits, kv_group_size, indexer_keys
    )
    assert out.token_ids == expected
    engine.close()
