"""The disk tier below the prefix cache: a fresh engine over the same cache directory (a restart)
reads a prompt's blocks back instead of computing them, and its greedy tokens equal mlx-lm's own
(float, 8-bit and 4-bit pages); a torn or corrupt file is skipped with one log line; another
block size, page format or model never reads the files; the byte cap evicts the least recently
used; an unwritable directory leaves the engine serving from RAM; a request waits for its blocks
while others generate."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import pytest

from macbatch.engine import Engine, RequestOutput
from macbatch.engine.kv.disk.files import HEADER_BYTES, SUFFIX, BlockFiles
from macbatch.engine.kv.disk.tier import DiskTier
from tests.support.disk_tier import GREEDY, disk_engine, warm
from tests.support.disk_tier import block_files as _block_files
from tests.support.disk_tier import tokens as _tokens
from tests.support.oracle import assert_matches_mlx_lm, assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_a_restart_reads_the_prompt_from_disk_and_matches_mlx_lm(
    model, tiny_tokenizer, tmp_path, bits
):
    prompt = _tokens(70, 1)  # 8 full blocks of 8 usable (one token always computed)
    warm(model, tiny_tokenizer, tmp_path, prompt, kv_bits=bits)
    written = _block_files(tmp_path)
    assert len(written) == 8  # the prompt's full blocks, none of the reply's
    engine = disk_engine(model, tiny_tokenizer, tmp_path, kv_bits=bits)
    out = engine.generate([prompt + _tokens(5, 2)], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 64 and out.metrics.cached_tokens == 64
    assert_matches_mlx_lm(model, prompt + _tokens(5, 2), out, kv_bits=bits)
    stats = engine.stats()
    assert stats.disk is not None and stats.disk.blocks_read == 8
    assert_pool_idle(engine)
    engine.close()


def test_a_later_prompt_reusing_ram_blocks_writes_them_too(model, tiny_tokenizer, tmp_path):
    """A conversation's reply becomes the next prompt: its blocks, found in RAM, are written
    then, so a restart finds the whole conversation."""
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    first = _tokens(20, 3)
    reply = engine.generate([first], GREEDY)[0].token_ids
    second = first + reply + _tokens(9, 4)  # 41 tokens: 5 full blocks
    engine.generate([second], GREEDY)
    engine.close()
    assert len(_block_files(tmp_path)) == 5
    fresh = disk_engine(model, tiny_tokenizer, tmp_path)
    out = fresh.generate([second + _tokens(3, 5)], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 40
    assert_matches_mlx_lm(model, second + _tokens(3, 5), out)


def test_torn_and_corrupt_files_are_skipped_with_one_line_each(
    model, tiny_tokenizer, tmp_path, caplog
):
    prompt = _tokens(50, 6)  # 6 blocks on disk
    warm(model, tiny_tokenizer, tmp_path, prompt)
    files = {bytes.fromhex(p.name[: -len(SUFFIX)]): p for p in _block_files(tmp_path)}
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    chain = _chain(engine, prompt)
    torn, flipped = files[chain[4]], files[chain[2]]
    torn.write_bytes(torn.read_bytes()[:-100])  # truncated: the tail never written
    data = bytearray(flipped.read_bytes())
    data[HEADER_BYTES + 7] ^= 0x40
    flipped.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="macbatch.disk_cache"):
        out = engine.generate([prompt], GREEDY)[0]
    assert_matches_mlx_lm(model, prompt, out)
    assert out.metrics.disk_cached_tokens == 16  # blocks 0 and 1: the chain stops at block 2
    lines = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(lines) == 2
    assert engine.stats().disk.corrupt == 2
    engine.close()  # the blocks computed again are written again, whole
    again = disk_engine(model, tiny_tokenizer, tmp_path)
    out = again.generate([prompt], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 48 and again.stats().disk.corrupt == 0
    again.close()


def _chain(engine: Engine, prompt: list[int]) -> list[bytes]:
    from macbatch.engine.kv.block_pool import chain_block_hashes

    usable = (len(prompt) - 1) // 8 * 8
    return chain_block_hashes(engine.kv.prefix_root, prompt[:usable], 8)


@pytest.mark.parametrize(
    "other",
    [dict(block_size=16), dict(kv_bits=8), dict(kv_bits=4), dict(model_seed=1)],
    ids=["block_size", "kv_bits8", "kv_bits4", "another_model"],
)
def test_another_format_or_model_never_reads_the_files(model, tiny_tokenizer, tmp_path, other):
    prompt = _tokens(70, 7)
    warm(model, tiny_tokenizer, tmp_path, prompt)
    seed = other.pop("model_seed", None)
    theirs = model if seed is None else build_model("qwen3", seed=seed)
    engine = disk_engine(theirs, tiny_tokenizer, tmp_path, **other)
    out = engine.generate([prompt], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 0
    assert out.token_ids == mlx_lm_greedy(theirs, prompt, 12, kv_bits=other.get("kv_bits"))
    engine.close()
    assert len(list(tmp_path.iterdir())) == 2  # a namespace of its own


def test_the_byte_cap_evicts_the_least_recently_used(tmp_path):
    payload = bytes(1000)
    size = HEADER_BYTES + len(payload)
    files = BlockFiles(tmp_path, "ns", cap_bytes=3 * size)
    files.open()
    digests = [bytes([i]) * 16 for i in range(5)]
    for d in digests[:3]:
        assert files.write(d, payload)
    assert files.read(digests[0]) == payload  # used: now the most recent
    files.write(digests[3], payload)
    assert digests[1] not in files and digests[0] in files
    assert files.total_bytes == 3 * size and len(_block_files(tmp_path)) == 3
    # a restart orders the LRU by the files' modification times (a read touches its file)
    again = BlockFiles(tmp_path, "ns", cap_bytes=3 * size)
    again.open()
    assert again.num_blocks == 3 and again.total_bytes == 3 * size
    again.write(digests[4], payload)
    assert again.num_blocks == 3


def test_an_unwritable_directory_warns_and_serves_from_ram(model, tiny_tokenizer, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="macbatch.disk_cache"):
        engine = disk_engine(model, tiny_tokenizer, blocker / "cache")
    assert engine.kv.disk is None
    assert any("RAM only" in r.getMessage() for r in caplog.records)
    prompt = _tokens(30, 8)
    assert engine.generate([prompt], GREEDY)[0].token_ids == mlx_lm_greedy(model, prompt, 12)


def test_a_full_disk_stops_writing_with_one_warning(model, tiny_tokenizer, tmp_path, caplog):
    import errno

    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    assert engine.kv.disk is not None

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    engine.kv.disk.files.write = full  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="macbatch.disk_cache"):
        for seed in (9, 10):
            prompt = _tokens(40, seed)
            assert engine.generate([prompt], GREEDY)[0].token_ids == mlx_lm_greedy(
                model, prompt, 12
            )
        engine.close()
    assert not engine.kv.disk.writing
    assert len([r for r in caplog.records if "full" in r.getMessage()]) == 1


def _gate_reads(disk: DiskTier) -> threading.Event:
    """The tier's file reads wait until the event returned is set."""
    gate = threading.Event()
    read = disk.files.read_into
    disk.files.read_into = lambda digest, parts: (gate.wait(10), read(digest, parts))[1]  # type: ignore[method-assign]
    return gate


def _finals(engine: Engine, holds: Callable[[], bool] = lambda: True) -> dict[str, RequestOutput]:
    """Step until every request finished (``holds`` true after each step); their last
    outputs."""
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        assert holds()
    return finals


def test_a_request_waits_for_its_blocks_while_others_generate(model, tiny_tokenizer, tmp_path):
    prompt = _tokens(70, 11)
    warm(model, tiny_tokenizer, tmp_path, prompt)
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    disk = engine.kv.disk
    assert disk is not None
    gate = _gate_reads(disk)
    other = _tokens(9, 12)
    engine.add_request(other, GREEDY, request_id="other")
    engine.step()
    engine.add_request(prompt, GREEDY, request_id="slow")
    outputs: dict[str, list[int]] = {}
    for _ in range(6):
        for out in engine.step():
            outputs[out.request_id] = out.token_ids
    assert len(outputs["other"]) >= 4 and "slow" not in outputs  # it waits, the other runs
    assert engine.scheduler.waiting and engine.scheduler.waiting[0].request_id == "slow"
    gate.set()
    finals = _finals(engine)
    assert finals["slow"].metrics.disk_cached_tokens == 64
    assert finals["slow"].token_ids == mlx_lm_greedy(model, prompt, 12)
    assert finals["other"].token_ids == mlx_lm_greedy(model, other, 12)
    engine.close()


def test_macbatch_cache_lists_per_model_and_clears(model, tiny_tokenizer, tmp_path):
    from typer.testing import CliRunner

    from macbatch.cli import app

    warm(model, tiny_tokenizer, tmp_path, _tokens(70, 13))
    warm(model, tiny_tokenizer, tmp_path, _tokens(70, 13), kv_bits=8)
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "--cache-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    rows = [line.split() for line in listed.output.splitlines()[1:3]]
    assert sorted(row[1] for row in rows) == ["8-bit", "float32"]
    assert all(row[0] == "model" and row[2] == "8" and row[3] == "8" for row in rows)
    cleared = runner.invoke(app, ["cache", "clear", "model", "--cache-dir", str(tmp_path)])
    assert cleared.exit_code == 0 and "cleared 2 cache(s)" in cleared.output
    assert not _block_files(tmp_path)
    empty = runner.invoke(app, ["cache", "--cache-dir", str(tmp_path)])
    assert "nothing cached" in empty.output


def test_reads_ahead_wait_past_their_bound(model, tiny_tokenizer, tmp_path):
    """Blocks read for requests not scheduled yet stay under ``max_read_bytes``: the oldest
    waiting request's reads start, a later one's wait until it is admitted."""
    first, second = _tokens(70, 20), _tokens(70, 21)
    warm(model, tiny_tokenizer, tmp_path, first)
    warm(model, tiny_tokenizer, tmp_path, second)
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    disk = engine.kv.disk
    assert disk is not None
    block = sum(engine.runner.store.block_slab_bytes())
    disk.reads.max_read_bytes = 2 * block
    gate = _gate_reads(disk)
    engine.add_request(first, GREEDY, request_id="first")
    engine.add_request(second, GREEDY, request_id="second")
    assert disk.counts().bytes_read_ahead == 8 * block  # the oldest's: all of them
    assert not engine.kv.prefix_ready("second")
    gate.set()
    finals = _finals(engine, lambda: disk.counts().bytes_read_ahead <= 8 * block)
    for rid, prompt in (("first", first), ("second", second)):
        assert finals[rid].metrics.disk_cached_tokens == 64
        assert finals[rid].token_ids == mlx_lm_greedy(model, prompt, 12)
    assert disk.counts().bytes_read_ahead == 0
    engine.close()


@pytest.mark.parametrize("shorter_stays", [True, False], ids=["both-run", "shorter-aborted"])
def test_a_longer_prompt_shares_a_waiting_prompts_reads(
    model, tiny_tokenizer, tmp_path, shorter_stays
):
    """Two waiting requests on one prefix read its blocks once, into the arrays of the one
    that started them: the longer prompt restores the rest of its own reads past what the
    shorter put in memory, or, the shorter aborted, rows of both requests' arrays; its greedy
    tokens equal mlx-lm's either way."""
    longer = _tokens(90, 30)  # 11 blocks on disk
    shorter = longer[:48] + _tokens(5, 31)  # its 6 blocks are the longer's first 6
    warm(model, tiny_tokenizer, tmp_path, longer)
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    disk = engine.kv.disk
    assert disk is not None
    gate = _gate_reads(disk)
    engine.add_request(shorter, GREEDY, request_id="shorter")
    engine.add_request(longer, GREEDY, request_id="longer")
    if not shorter_stays:
        engine.abort("shorter")
    gate.set()
    finals = _finals(engine)
    assert finals["longer"].token_ids == mlx_lm_greedy(model, longer, 12)
    assert finals["longer"].metrics.disk_cached_tokens == (40 if shorter_stays else 88)
    if shorter_stays:
        assert finals["shorter"].token_ids == mlx_lm_greedy(model, shorter, 12)
        assert finals["shorter"].metrics.disk_cached_tokens == 48
    assert disk.counts().blocks_read == 11  # each block once
    _assert_pages_are_the_files(engine, _chain(engine, longer)[:11])
    engine.close()


def _assert_pages_are_the_files(engine: Engine, chain: list[bytes]) -> None:
    """The pages of ``chain``'s blocks in memory are the bytes of their files (greedy tokens
    of a tiny random model can survive a block of zeros)."""
    disk = engine.kv.disk
    assert disk is not None
    pages = disk.parts[""]
    for digest in chain:
        block = pages.lookup(digest)
        assert block is not None
        held = b"".join(np.array(a).tobytes() for a in pages.gather([block]))
        assert held == bytes(disk.files.read(digest) or b"")
