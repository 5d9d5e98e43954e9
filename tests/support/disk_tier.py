"""Engines over a disk cache directory for the disk tier's tests: a tiny engine with small
blocks, one that computes a prompt and exits (its blocks written), the block files there, and a
conversation whose later turns a fresh engine resumes from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from macbatch.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from macbatch.engine.kv.disk.files import SUFFIX
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import random_prompts
from tests.support.tiny import VOCAB_SIZE

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB_SIZE, size=n).tolist()


def disk_engine(model, tokenizer, cache: Path, **config) -> Engine:
    settings = dict(
        num_blocks=64, block_size=8, max_num_batched_tokens=32, disk_cache_dir=str(cache)
    )
    return Engine(model, tokenizer, EngineConfig(**{**settings, **config}))


def block_files(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"*/*/*{SUFFIX}"))


def warm(model, tokenizer, cache: Path, prompt: list[int], **config) -> None:
    """An engine that computes ``prompt`` and exits (its blocks written)."""
    engine = disk_engine(model, tokenizer, cache, **config)
    engine.generate([prompt], GREEDY)
    engine.close()


def conversation_across_a_restart(
    path: Path, config: EngineConfig, params: SamplingParams, seed: int
) -> list[tuple[list[int], RequestOutput]]:
    """A conversation's first two turns on an engine over ``config.disk_cache_dir``, which is
    closed; then, on a fresh engine over the same directory, its third turn and its second turn
    with the user's message edited, each resuming after the last block boundary it shares with
    a prompt of the first engine, read back from disk: the second turn's prompt blocks, and the
    first reply's, which the second turn reused (a state there was left while decoding).
    Every prompt with its output, in that order."""
    first = Engine.load(str(path), config)
    assert first.kv.disk is not None, "the tier keeps this model"
    one, two, three, edited = random_prompts([45, 12, 5, 6], seed)
    [reply] = first.generate([one], params)
    two = one + reply.token_ids + two
    [second] = first.generate([two], params)
    first.close()
    fresh = Engine.load(str(path), config)
    three = two + second.token_ids + three
    edited = one + reply.token_ids + edited
    shared = [len(two), len(one) + len(reply.token_ids)]  # what each shares with the first
    outs = [fresh.generate([prompt], params)[0] for prompt in (three, edited)]
    for out, tokens in zip(outs, shared):
        assert out.metrics is not None and out.metrics.disk_cached_tokens > 0
        assert out.metrics.cached_tokens == tokens // config.block_size * config.block_size
    stats = fresh.stats().disk
    assert stats is not None and stats.corrupt == 0
    assert_pool_idle(fresh)
    fresh.close()
    return list(zip([one, two, three, edited], [reply, second, *outs], strict=True))
