"""The disk tier (issue 45), one long agent prompt: time to first token computed cold, then after a
restart (a fresh engine over the same cache directory) with its blocks on disk, dropped from the
page cache first (``posix_fadvise DONTNEED``) where the system allows, so they come off the
disk; and read-back rates against a sequential read of one file of the same size, all cold, in
the same run: one thread reading and checking every block file, and the tier's own read of the
prompt's blocks (``prefetch`` until ``ready``, on its reader threads, in a third fresh engine).
Random-weight model of a real shape (``--shape``: ``qwen3`` is Qwen3-0.6B's, 28 layers;
``qwen3_5`` Qwen3.5's hybrid, 24 layers; ``bench`` the 8-layer bench model), ``--layers`` fewer
of them to fit a small machine, float32 on the CPU.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.disk_cache [--tokens 16384 32768] [--shape qwen3] [--layers 28]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import SHAPES, shaped_model, warn_without_openblas
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.block_pool import chain_block_hashes
from macbatch.engine.kv.disk.files import SUFFIX, BlockFiles
from macbatch.engine.kv.disk.reads import READERS

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def drop_from_page_cache(paths: list[Path]) -> bool:
    """Ask the kernel to forget the files' pages (False: this system cannot)."""
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


def block_paths(files: BlockFiles) -> list[Path]:
    return sorted(files.directory.glob(f"*/*{SUFFIX}"))


def one_thread_rate(files: BlockFiles) -> tuple[float, int]:
    """(bytes/s, bytes) of reading and checking every block file in turn on one thread."""
    paths = block_paths(files)
    total = sum(p.stat().st_size for p in paths)
    drop_from_page_cache(paths)
    start = time.perf_counter()
    for path in paths:
        assert files.read(bytes.fromhex(path.name[: -len(SUFFIX)])) is not None
    return total / (time.perf_counter() - start), total


def tier_rate(engine: Engine, prompt: list[int]) -> float:
    """Bytes/s of the tier reading the prompt's blocks for a waiting request (none in RAM)."""
    disk = engine.kv.disk
    assert disk is not None
    drop_from_page_cache(block_paths(disk.files))
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
    drop_from_page_cache([one])
    start = time.perf_counter()
    with open(one, "rb") as f:
        while f.read(8 << 20):
            pass
    elapsed = time.perf_counter() - start
    one.unlink()
    return total / elapsed


def first_token(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens read from disk), after a short prompt of
    other tokens has paid the engine's first-call costs."""
    engine.generate([[7] * 8], ONE_TOKEN)
    out = engine.generate([prompt], ONE_TOKEN)[0]
    return out.metrics.time_to_first_token_s or 0.0, out.metrics.disk_cached_tokens


def restart(model, tokenizer, vocab: int, tokens: int, cache: str) -> bool:
    """One prompt of ``tokens``, cold and after a restart; False when the model's caches are
    not kept on disk yet."""
    prompt = synthetic_prompts(1, tokens, tokens, vocab, seed=tokens)[0]
    config = EngineConfig(disk_cache_dir=cache, kv_shrink_after_s=None)
    cold = Engine(model, tokenizer, config)
    if cold.kv.disk is None:
        return False
    cold_s, _ = first_token(cold, prompt)
    started = time.perf_counter()
    cold.close()  # the last blocks written
    drain_s = time.perf_counter() - started
    written = cold.stats().disk
    assert written is not None
    files = block_paths(cold.kv.disk.files)
    dropped = drop_from_page_cache(files)
    started = time.perf_counter()
    warm = Engine(model, tokenizer, config)
    built_s = time.perf_counter() - started
    warm_s, from_disk = first_token(warm, prompt)
    ram_s, _ = first_token(warm, prompt)  # its blocks in RAM now: the compute left
    read = warm.stats().disk
    assert read is not None and warm.kv.disk is not None
    print(
        f"{tokens:,}-token prompt, cold: first token {cold_s:.2f} s; {written.blocks_written:,} "
        f"blocks written, {written.bytes_written / 2**20:,.1f} MiB (the writer drained "
        f"{drain_s:.2f} s after the reply)"
    )
    where = "off the disk" if dropped else "page cache not dropped"
    print(
        f"  after a restart ({where}): first token {warm_s:.3f} s, {from_disk:,} prompt tokens "
        f"read back ({read.bytes_read / 2**20:,.1f} MiB, {read.bytes_read / warm_s / 2**20:,.0f} "
        f"MiB/s over the whole wait); engine built in {built_s:.2f} s; "
        f"{cold_s / warm_s:.1f}x sooner (target 10x); from RAM (the same engine, again) "
        f"{ram_s:.3f} s"
    )
    warm.close()
    reader = Engine(model, tokenizer, config)
    assert reader.kv.disk is not None
    one, total = one_thread_rate(reader.kv.disk.files)
    tier = tier_rate(reader, prompt)
    sequential = sequential_rate(reader.kv.disk.files.root, total)
    print(
        f"  read-back: the tier ({READERS} readers, checked) {tier / 2**20:,.0f} MiB/s, one "
        f"thread {one / 2**20:,.0f} MiB/s, a sequential read of one {total / 2**20:,.0f} MiB "
        f"file {sequential / 2**20:,.0f} MiB/s: the tier at {tier / sequential:.0%} of it "
        "(target 50%)"
    )
    reader.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3")
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's own")
    parser.add_argument("--cache-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()
    warn_without_openblas()
    model, tokenizer, vocab = shaped_model(args.shape, args.layers, max(args.tokens) + 64)
    print(f"--shape {args.shape}, {len(model.layers)} layers, float32")
    for tokens in args.tokens:
        with tempfile.TemporaryDirectory(dir=args.cache_dir) as cache:
            if not restart(model, tokenizer, vocab, tokens, cache):
                print(f"--shape {args.shape}: the disk tier is off for this model (the "
                      "warning above says why)")  # fmt: skip
                return


if __name__ == "__main__":
    main()
