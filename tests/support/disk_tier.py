"""Engines over a disk cache directory for the disk tier's tests: a tiny engine with small
blocks, one that computes a prompt and exits (its blocks written), and the block files there."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.disk.files import SUFFIX
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
