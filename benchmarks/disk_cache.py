"""The disk tier (issue 45): time to first token of a long prompt computed cold, then after a
restart (a fresh engine over the same cache directory) with its blocks on disk, and read-back
rates against a sequential read of one file of the same size: one thread reading and checking
every block file, and the tier's own read of the prompt's blocks (``prefetch`` until ``ready``,
on its reader threads, in a third fresh engine). The files are dropped from the page cache
before each (``posix_fadvise DONTNEED``) where the system allows, the restart's included. Random
Qwen3-shaped model (``--qwen3-0.6b``: Qwen3-0.6B's shape), float32 on the CPU.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.disk_cache [--tokens 16384] [--qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import QWEN3_0_6B, bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.bench import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.block_pool import chain_block_hashes

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def _drop_from_page_cache(paths: list[Path]) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _ttft(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    out = engine.generate([prompt], ONE_TOKEN)[0]
    return out.metrics.time_to_first_token_s or 0.0, out.metrics.disk_cached_tokens


def _block_paths(engine: Engine) -> list[Path]:
    disk = engine.kv.disk
    assert disk is not None
    return sorted(disk.files.directory.glob("*/*.kvb"))


def one_thread_rate(engine: Engine) -> tuple[float, int, bool]:
    """(bytes/s, bytes, dropped from the page cache) of reading and checking every block file
    in turn on one thread."""
    disk = engine.kv.disk
    assert disk is not None
    paths = _block_paths(engine)
    total = sum(p.stat().st_size for p in paths)
    dropped = _drop_from_page_cache(paths)
    start = time.perf_counter()
    for path in paths:
        assert disk.files.read(bytes.fromhex(path.stem)) is not None
    return total / (time.perf_counter() - start), total, dropped


def tier_rate(engine: Engine, prompt: list[int]) -> float:
    """Bytes/s of the tier reading the prompt's blocks for a waiting request (none in RAM)."""
    disk = engine.kv.disk
    assert disk is not None
    _drop_from_page_cache(_block_paths(engine))
    usable = (len(prompt) - 1) // engine.config.block_size * engine.config.block_size
    chain = chain_block_hashes(
        engine.kv.prefix_root or b"", prompt[:usable], engine.config.block_size
    )
    before = disk.counts().bytes_read
    start = time.perf_counter()
    disk.prefetch("bench", chain)
    while not disk.ready("bench"):
        disk.wait(1.0)
    elapsed = time.perf_counter() - start
    disk.forget("bench")
    return (disk.counts().bytes_read - before) / elapsed


def sequential_rate(directory: Path, total: int) -> float:
    """Bytes/s of reading one ``total``-byte file written in ``directory``, from disk."""
    one = directory / "sequential.bin"
    with open(one, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(total // len(chunk) + 1):
            f.write(chunk)
    _drop_from_page_cache([one])
    start = time.perf_counter()
    with open(one, "rb") as f:
        while f.read(8 << 20):
            pass
    elapsed = time.perf_counter() - start
    one.unlink()
    return total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--qwen3-0.6b", dest="qwen", action="store_true")
    parser.add_argument("--cache-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()
    warn_without_openblas()
    shape = dict(QWEN3_0_6B) if args.qwen else {}
    shape["max_position_embeddings"] = max(args.tokens + 64, 8192)
    model = build_bench_model(**shape)
    tokenizer = bench_tokenizer(shape.get("vocab_size", 32000))
    prompt = synthetic_prompts(1, args.tokens, args.tokens, 32000, seed=1)[0]
    with tempfile.TemporaryDirectory(dir=args.cache_dir) as cache:
        config = EngineConfig(disk_cache_dir=cache, kv_shrink_after_s=None)
        cold = Engine(model, tokenizer, config)
        cold_ttft, _ = _ttft(cold, prompt)
        started = time.perf_counter()
        cold.close()  # the last blocks written
        drain_s = time.perf_counter() - started
        written = cold.stats().disk
        assert written is not None
        _drop_from_page_cache(_block_paths(cold))
        started = time.perf_counter()
        warm = Engine(model, tokenizer, config)
        load_s = time.perf_counter() - started
        warm_ttft, from_disk = _ttft(warm, prompt)
        read = warm.stats().disk
        assert read is not None
        print(f"prompt {args.tokens:,} tokens, {len(model.layers)} layers")
        print(
            f"cold: time to first token {cold_ttft:.2f} s; {written.blocks_written:,} blocks "
            f"written, {written.bytes_written / 2**20:,.1f} MiB (writer drained {drain_s:.2f} s "
            f"after the reply)"
        )
        print(
            f"after a restart: time to first token {warm_ttft:.3f} s, {from_disk:,} prompt "
            f"tokens read from disk ({read.bytes_read / 2**20:,.1f} MiB); engine built in "
            f"{load_s:.2f} s; {cold_ttft / warm_ttft:.1f}x faster"
        )
        one, total, dropped = one_thread_rate(warm)
        warm.close()
        third = Engine(model, tokenizer, config)
        tier = tier_rate(third, prompt)
        third.close()
        sequential = sequential_rate(Path(cache), total)
        where = "from disk" if dropped else "page cache not dropped"
        print(
            f"read-back ({where}): the tier's readers {tier / 2**20:,.0f} MiB/s "
            f"({tier / sequential:.0%}), one thread reading and checking each file "
            f"{one / 2**20:,.0f} MiB/s ({one / sequential:.0%}); a sequential read of one "
            f"{total / 2**20:,.0f} MiB file {sequential / 2**20:,.0f} MiB/s"
        )


if __name__ == "__main__":
    main()
