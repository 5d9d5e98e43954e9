"""The disk tier keeps every cache group's part of a prefix: a sliding window's blocks, a hybrid
model's state checkpoints, the target's pages under a draft model. After a restart (a fresh
engine over the same cache directory) a prompt's prefix is read back instead of computed, and
greedy tokens equal mlx-lm's own (float, 8-bit and 4-bit pages); a torn checkpoint file is
skipped (a checkpoint further back is read instead); a prefix is read back only as far as every
group has its part; another window never reads the files."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.block_pool import chain_block_hashes
from macbatch.engine.kv.disk.files import HEADER_BYTES, SUFFIX, BlockFiles, file_key
from tests.support.oracle import assert_matches_mlx_lm, assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import VOCAB_SIZE, build_model

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
BLOCK = 8


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB_SIZE, size=n).tolist()


def _engine(model, tokenizer, cache: Path, draft=None, **config) -> Engine:
    settings = dict(
        num_blocks=64, block_size=BLOCK, max_num_batched_tokens=32, disk_cache_dir=str(cache)
    )
    if draft is not None:
        settings.update(speculative="draft", num_speculative_tokens=3)
    return Engine(model, tokenizer, EngineConfig(**{**settings, **config}), draft_model=draft)


def _warm(model, tokenizer, cache: Path, prompt: list[int], **config) -> None:
    """An engine that computes ``prompt`` (in 32-token chunks: a hybrid checkpoints after blocks
    4 and 8) and exits, its parts written."""
    engine = _engine(model, tokenizer, cache, **config)
    assert engine.kv.disk is not None, "the tier keeps this model"
    engine.generate([prompt], GREEDY)
    engine.close()


def _files(cache: Path) -> dict[bytes, Path]:
    return {bytes.fromhex(p.name[: -len(SUFFIX)]): p for p in cache.glob(f"*/*/*{SUFFIX}")}


@pytest.mark.parametrize(
    ("arch", "bits"),
    [("gemma3_text", None), ("gemma3_text", 4), ("qwen3_5", None), ("qwen3_5", 8)],
)
def test_a_restart_reads_every_group_from_disk_and_matches_mlx_lm(
    arch, bits, tiny_tokenizer, tmp_path
):
    model = build_model(arch)
    prompt = _tokens(70, 1)
    _warm(model, tiny_tokenizer, tmp_path, prompt, kv_bits=bits)
    engine = _engine(model, tiny_tokenizer, tmp_path, kv_bits=bits)
    longer = prompt + _tokens(5, 2)  # 9 usable blocks: the prompt's 8 are on disk
    out = engine.generate([longer], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 64 and out.metrics.cached_tokens == 64
    assert_matches_mlx_lm(model, longer, out, kv_bits=bits)
    assert_pool_idle(engine)
    engine.close()


@pytest.mark.parametrize("arch", ["gemma3_text", "qwen3_5"])
def test_the_oracle_sees_a_block_zeroed_after_its_checksum(
    arch, tiny_tokenizer, tmp_path, monkeypatch
):
    """Every part read from disk zeroed once it passed its checksum: the log-probabilities
    differ from mlx-lm's, so the parity tests above would catch wrong bytes read back."""
    model = build_model(arch)
    prompt = _tokens(70, 1)
    _warm(model, tiny_tokenizer, tmp_path, prompt)
    read_into = BlockFiles.read_into

    def zeroed(self, digest, parts):
        whole = read_into(self, digest, parts)
        for part in parts:
            np.frombuffer(part, np.uint8)[:] = 0
        return whole

    monkeypatch.setattr(BlockFiles, "read_into", zeroed)
    engine = _engine(model, tiny_tokenizer, tmp_path)
    longer = prompt + _tokens(5, 2)
    out = engine.generate([longer], GREEDY)[0]
    engine.close()
    assert out.metrics.disk_cached_tokens == 64
    with pytest.raises(AssertionError):
        assert_matches_mlx_lm(model, longer, out)


@pytest.mark.parametrize("copies", [1, 2])
def test_a_torn_checkpoint_is_skipped_and_an_earlier_one_read(
    copies, tiny_tokenizer, tmp_path, caplog
):
    """``copies`` requests waiting on the same prompt share its reads, and each plans again
    when the checkpoint's read fails."""
    model = build_model("qwen3_5")
    prompt = _tokens(70, 3)
    _warm(model, tiny_tokenizer, tmp_path, prompt)
    engine = _engine(model, tiny_tokenizer, tmp_path)
    chain = chain_block_hashes(engine.kv.prefix_root, prompt[:64], BLOCK)
    files = _files(tmp_path)
    assert file_key("state", chain[3]) in files  # checkpoints after blocks 4 and 8
    torn = files[file_key("state", chain[7])]
    whole = torn.read_bytes()
    torn.write_bytes(whole[:-100])
    with caplog.at_level(logging.WARNING, logger="macbatch.disk_cache"):
        outs = engine.generate([prompt] * copies, GREEDY)
    expected = mlx_lm_greedy(model, prompt, 12)
    assert all(out.token_ids == expected for out in outs)
    # the first resumed after the checkpoint of block 4, read from disk; a copy admitted later
    # finds that in RAM, or the whole prompt once the first computed it
    assert min(out.metrics.cached_tokens for out in outs) == 32
    assert sum(out.metrics.disk_cached_tokens for out in outs) == 32
    assert len([r for r in caplog.records if "corrupt" in r.getMessage()]) == 1
    assert engine.stats().disk.corrupt == 1
    engine.close()  # the checkpoint computed again is written again, whole
    assert torn.read_bytes() == whole


def test_every_group_must_have_its_part_on_disk(tiny_tokenizer, tmp_path):
    """A window block missing on disk: the prefix read back stops where every group has what
    it needs (the window before block 7 is block 6, still there), as in RAM."""
    model = build_model("gemma3_text")
    prompt = _tokens(70, 7)
    _warm(model, tiny_tokenizer, tmp_path, prompt)
    probe = _engine(model, tiny_tokenizer, tmp_path)
    chain = chain_block_hashes(probe.kv.prefix_root, prompt[:64], BLOCK)
    probe.close()
    _files(tmp_path)[file_key("window", chain[7])].unlink()
    engine = _engine(model, tiny_tokenizer, tmp_path)
    out = engine.generate([prompt], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 56
    assert out.token_ids == mlx_lm_greedy(model, prompt, 12)
    engine.close()


def test_another_window_never_reads_the_files(tiny_tokenizer, tmp_path):
    """Same weights, another sliding window: a namespace of its own."""
    prompt = _tokens(70, 4)
    _warm(build_model("gemma3_text"), tiny_tokenizer, tmp_path, prompt)
    theirs = build_model("gemma3_text", sliding_window=16)
    engine = _engine(theirs, tiny_tokenizer, tmp_path)
    out = engine.generate([prompt], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 0
    assert out.token_ids == mlx_lm_greedy(theirs, prompt, 12)
    engine.close()
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_a_draft_model_speculates_over_a_prefix_read_from_disk(tiny_tokenizer, tmp_path):
    """With a draft model the tier keeps the target's pages (the draft catches up from the
    start over any cached prefix): after a restart the prefix is read back, and speculating
    over it gives mlx-lm's tokens with every draft accepted (the target drafts itself)."""
    target = build_model("qwen3")
    prompt = _tokens(70, 5)
    _warm(target, tiny_tokenizer, tmp_path, prompt, draft=target)
    engine = _engine(target, tiny_tokenizer, tmp_path, draft=target)
    target_bytes = sum(engine.runner.store.block_slab_bytes())
    assert {p.stat().st_size - HEADER_BYTES for p in _files(tmp_path).values()} == {target_bytes}
    longer = prompt + _tokens(5, 6)
    out = engine.generate([longer], GREEDY)[0]
    assert out.metrics.disk_cached_tokens == 64
    assert out.token_ids == mlx_lm_greedy(target, longer, 12)
    stats = engine.stats().speculation
    assert stats.accepted == stats.drafted > 0
    engine.close()
