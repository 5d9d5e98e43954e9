"""The disk tier touches only what it made (issue 61, items 2 to 5): ``cache clear`` pointed at
a data directory deletes only caches' block files; start-up removes only its own stale
temporary files; links planted in the cache directory are never written through nor followed
when sizes are summed; a clear under a running engine leaves it writing, its byte count
following the disk. Every check re-reads the files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine import clear_stored, stored_models
from macbatch.engine.kv.disk.files import MAGIC, SUFFIX, BlockFiles
from tests.support.disk_tier import GREEDY, block_files, disk_engine, tokens, warm
from tests.support.tiny import build_model

HOURS_AGO = time.time() - 2 * 3600
DIGEST = bytes.fromhex("ab" * 16)


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


def _plant(path: Path, data: bytes = b"the user's own bytes", old: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if old:
        os.utime(path, (HOURS_AGO, HOURS_AGO))
    return path


def _the_cache(root: Path) -> list:
    """The engine's namespace (a look-alike folder is not it, whatever a listing says)."""
    return [m for m in stored_models(root) if m.model == "model" and m.directory.name != "fake"]


def _users_files(root: Path) -> list[Path]:
    """A data directory's own files, some shaped like the tier's (names, a header)."""
    return [
        _plant(root / "photos" / "holiday.jpg"),
        _plant(root / "serve" / "batches" / "b1.jsonl"),
        _plant(root / "proj" / "build" / "session.tmp", old=True),
        _plant(root / "proj" / "ab" / f"{'ab' * 16}{SUFFIX}", MAGIC + bytes(200), old=True),
        _plant(root / "fake" / "namespace.json", b'{"model": "model"}'),
        _plant(root / "fake" / "ab" / f"{'cd' * 16}{SUFFIX}", MAGIC + bytes(200)),
    ]


def test_cache_clear_in_a_data_directory_deletes_only_the_caches(model, tiny_tokenizer, tmp_path):
    planted = _users_files(tmp_path)
    warm(model, tiny_tokenizer, tmp_path, tokens(70, 1))
    [cache] = _the_cache(tmp_path)
    inside = [
        _plant(cache.directory / "notes.txt"),  # in a cache's folder, not the cache's
        _plant(cache.directory / "ab" / f"{'ef' * 16}{SUFFIX}", b"no header"),
        _plant(cache.directory / "ab" / "x.tmp", old=True),
    ]
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "--cache-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    for name in ("photos", "serve", "proj", "fake"):
        assert f"not a cache (left alone): {tmp_path / name}" in listed.output
    assert [m.model for m in stored_models(tmp_path)] == ["model"]
    cleared = runner.invoke(app, ["cache", "clear", "--cache-dir", str(tmp_path)])
    assert cleared.exit_code == 0 and "cleared 1 cache(s)" in cleared.output
    for path in planted + inside:
        assert path.exists(), path
    # the block files, namespace.json and the emptied shards gone; the rest stays
    assert sorted(cache.directory.rglob("*")) == sorted([cache.directory / "ab", *inside])


def test_start_up_removes_only_its_own_stale_temporary_files(model, tiny_tokenizer, tmp_path):
    planted = _users_files(tmp_path)
    warm(model, tiny_tokenizer, tmp_path, tokens(30, 2))
    [cache] = _the_cache(tmp_path)
    mine = _plant(cache.directory / "ab" / f"{'ab' * 16}{SUFFIX}.99999.1.tmp", MAGIC, old=True)
    fresh = _plant(cache.directory / "ab" / f"{'cd' * 16}{SUFFIX}.99999.2.tmp", MAGIC)
    theirs = _plant(cache.directory / "ab" / "session.tmp", old=True)
    # a cap of one block: a write evicts everything counted, so nothing of theirs may count
    one_block = block_files(tmp_path)[0].stat().st_size
    engine = disk_engine(model, tiny_tokenizer, tmp_path, disk_cache_bytes=one_block)
    engine.generate([tokens(30, 3)], GREEDY)
    engine.close()
    assert len(block_files(tmp_path)) == 1 + 2  # the newest block and the two planted
    assert not mine.exists() and fresh.exists() and theirs.exists()
    for path in planted:
        assert path.exists(), path


def test_a_linked_shard_folder_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    files = BlockFiles(tmp_path / "cache", "ns", cap_bytes=2**20)
    files.open()
    (files.directory / "ab").symlink_to(outside)
    with pytest.raises(OSError, match="link"):
        files.write(DIGEST, bytes(100))
    assert not list(outside.iterdir()) and DIGEST not in files
    other = bytes.fromhex("cd" * 16)
    assert files.write(other, bytes(100))  # the other shards are written
    assert files.read(other) == bytes(100)


def test_a_linked_namespace_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    files = BlockFiles(tmp_path / "cache", "ns", cap_bytes=2**20)
    (tmp_path / "cache").mkdir()
    files.directory.symlink_to(outside)
    with pytest.raises(OSError, match="link"):
        files.open()
    assert not list(outside.iterdir())


def test_macbatch_cache_does_not_follow_links_when_it_sums(model, tiny_tokenizer, tmp_path):
    root = tmp_path / "cache"
    warm(model, tiny_tokenizer, root, tokens(70, 3))
    [cache] = stored_models(root)
    real = sum(p.stat().st_size for p in block_files(root))
    outside = tmp_path / "outside"
    for i in range(4):
        _plant(outside / (f"{i:02x}" * 16 + SUFFIX), MAGIC + bytes(2**20))
    (cache.directory / "fe").symlink_to(outside)
    big = _plant(tmp_path / "big", MAGIC + bytes(2**20))
    (cache.directory / "ab").mkdir(exist_ok=True)
    (cache.directory / "ab" / f"{'ab' * 16}{SUFFIX}").symlink_to(big)
    [listed] = stored_models(root)
    assert listed.bytes == real and listed.blocks == 8
    clear_stored(root)
    assert big.exists() and len(list(outside.iterdir())) == 4


def test_a_clear_under_a_running_engine_leaves_it_writing(model, tiny_tokenizer, tmp_path):
    engine = disk_engine(model, tiny_tokenizer, tmp_path)
    disk = engine.kv.disk
    assert disk is not None
    engine.generate([tokens(70, 4)], GREEDY)
    disk.capture_now()
    disk._writer.submit(lambda: None).result()  # the writes queued are done
    assert disk.counts().bytes_on_disk == sum(p.stat().st_size for p in block_files(tmp_path))
    assert clear_stored(tmp_path) and not block_files(tmp_path)
    assert disk.counts().bytes_on_disk == 0  # what is on disk, not what was written
    engine.generate([tokens(70, 5)], GREEDY)
    engine.close()
    written = block_files(tmp_path)
    assert len(written) == 8
    assert disk.counts().bytes_on_disk == sum(p.stat().st_size for p in written)
    assert [m.model for m in stored_models(tmp_path)] == ["model"]  # a cache again
