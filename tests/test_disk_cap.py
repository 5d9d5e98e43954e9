"""The disk KV cache's default cap (issue 65, item 10): twice the model's weights, at least
256 MiB, at most 20 GiB and a tenth of the disk's free space (the oracle: that rule written out
here); it is said at start, and `macbatch cache` says the rule. Eviction keeps the folder under
the cap chosen, summed from the files on disk."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.commands.options import disk_cache_config
from macbatch.demo import MODEL_DIR
from tests.support.disk_tier import GREEDY, disk_engine
from tests.support.disk_tier import tokens as _tokens
from tests.support.tiny import build_model

MIB, GIB = 2**20, 2**30
Usage = namedtuple("Usage", "total used free")
QWEN3_8B = "mlx-community/Qwen3-8B-4bit"  # the front ends give the cap resolved names


@pytest.fixture
def free_space(monkeypatch, tmp_path):
    """Set the free space every cap sees; no model in the hub cache."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))

    def set_free(free: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(free * 2, free, free))

    return set_free


def _cap(models: tuple[str, ...], directory: Path, gb: float | None = None) -> int:
    return disk_cache_config(directory, gb, False, models)["disk_cache_bytes"]


def test_the_cap_follows_the_model(free_space, tmp_path) -> None:
    free_space(10_000 * GIB)
    demo = sum(p.stat().st_size for p in MODEL_DIR.glob("*.safetensors"))
    assert demo < 128 * MIB
    assert _cap(("demo",), tmp_path) == 256 * MIB  # the demo's 3.4 MiB: the floor
    # a big model not downloaded: the catalogue's figure, 8.2e9 parameters x 4.5 bits
    assert _cap((QWEN3_8B,), tmp_path) == 2 * int(8.2e9 * 4.5 / 8)
    assert _cap(("mlx-community/Llama-3.3-70B-Instruct-4bit",), tmp_path) == 20 * GIB
    assert _cap(("demo", QWEN3_8B), tmp_path) == 2 * int(8.2e9 * 4.5 / 8)  # the largest
    assert _cap(("someone/unknown",), tmp_path) == 20 * GIB  # not known: the ceiling
    free_space(1 * GIB)  # a full laptop disk: a tenth of what is free
    assert _cap(("demo",), tmp_path) == GIB // 10
    assert _cap(("demo",), tmp_path, gb=0.5) == GIB // 2  # --cache-disk-gb wins


def test_the_cap_is_said_at_start_and_in_cache(free_space, tmp_path) -> None:
    free_space(10_000 * GIB)
    runner = CliRunner()
    chat = runner.invoke(app, ["chat", "--cache-dir", str(tmp_path)])  # no terminal: it stops
    assert f"disk KV cache: up to 0.25 GiB in {tmp_path}" in chat.stderr
    listed = runner.invoke(app, ["cache", "--cache-dir", str(tmp_path)])
    assert "2 x the model's weights, at least 256 MiB, at most 20,480.0 MiB" in listed.stdout


def test_eviction_keeps_the_folder_under_the_cap(free_space, tmp_path, tiny_tokenizer) -> None:
    free_space(10 * 24 * 1024)  # a tenth: 24 KiB, a few of the tiny model's blocks
    cap = _cap(("demo",), tmp_path)
    assert cap == 24 * 1024
    engine = disk_engine(build_model("qwen3"), tiny_tokenizer, tmp_path, disk_cache_bytes=cap)
    for seed in range(4):
        engine.generate([_tokens(40, seed)], GREEDY)
    engine.close()
    files = list(tmp_path.rglob("*.kvb"))
    written = engine.stats().disk
    assert written is not None and written.bytes_written > 2 * cap  # so some were evicted
    assert 0 < sum(p.stat().st_size for p in files) <= cap
