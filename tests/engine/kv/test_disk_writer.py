"""The disk tier's writer copies a block's bytes out on its own thread, from the step's gathers read
in place (``DiskTier.flush`` hands it views, not copies): a block written after the pool reused
its pages for other prompts is still the bytes the prompt computed, and a restart reads it."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.block_pool import chain_block_hashes
from tests.support.oracle import assert_matches_mlx_lm
from tests.support.tiny import VOCAB_SIZE, build_model

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=0)
BLOCK = 8


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB_SIZE, size=n).tolist()


def _engine(model, tokenizer, cache: Path | None) -> Engine:
    config = EngineConfig(
        num_blocks=64,
        block_size=BLOCK,
        max_num_batched_tokens=64,
        disk_cache_dir=None if cache is None else str(cache),
    )
    return Engine(model, tokenizer, config)


def _chain(engine: Engine, prompt: list[int]) -> list[bytes]:
    usable = (len(prompt) - 1) // BLOCK * BLOCK
    return chain_block_hashes(engine.kv.prefix_root or b"", prompt[:usable], BLOCK)


def _page_bytes(engine: Engine, chain: list[bytes]) -> list[bytes]:
    """Each block's pages as the tier lays them out in a file (every page array's slab)."""
    full = engine.kv.full
    blocks = [full.pool.lookup(d) for d in chain]
    assert None not in blocks
    out = []
    for block in blocks:
        arrays = engine.runner.store.gather_blocks([block])
        out.append(b"".join(np.array(a).tobytes() for a in arrays))
    return out


def test_blocks_written_after_their_pages_were_reused_are_the_computed_bytes(
    tiny_tokenizer, tmp_path
):
    model = build_model("qwen3")
    prompt = _tokens(70, 1)  # 8 full blocks of 8 usable
    alone = _engine(model, tiny_tokenizer, None)  # the oracle: the same prompt, no disk tier
    alone.generate([prompt], GREEDY)
    expected = _page_bytes(alone, _chain(alone, prompt))

    engine = _engine(model, tiny_tokenizer, tmp_path)
    disk = engine.kv.disk
    assert disk is not None
    gate = threading.Event()
    disk._writer.submit(gate.wait)  # the writer waits: every capture queues behind this
    engine.generate([prompt], GREEDY)
    for seed in range(2, 5):  # 3 x 25 blocks through a 64-block pool: the prompt's are reused
        engine.generate([_tokens(200, seed)], GREEDY)
    chain = _chain(engine, prompt)
    assert all(engine.kv.full.pool.lookup(d) is None for d in chain)
    assert disk.counts().blocks_written == 0
    gate.set()
    engine.close()

    assert [bytes(disk.files.read(d) or b"") for d in chain] == expected
    restarted = _engine(model, tiny_tokenizer, tmp_path)
    out = restarted.generate([prompt + _tokens(5, 9)], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 64
    assert_matches_mlx_lm(model, prompt + _tokens(5, 9), out)
    assert _page_bytes(restarted, chain) == expected
    restarted.close()
