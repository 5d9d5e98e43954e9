"""/metrics reports the disk tier's writes as they land, not as of the engine's last step: a
reply's last blocks are written by the tier's writer after that step, while the engine idles,
so a scrape after the writer finished counts every file. The oracle is the files themselves
(their number and sizes)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from macbatch.engine import Engine, EngineConfig, EngineThread, SamplingParams
from macbatch.engine.kv.disk.files import SUFFIX
from tests.support.live_server import serving
from tests.support.metrics_scrape import scrape
from tests.support.tiny import VOCAB_SIZE, build_model

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _files(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"*/*/*{SUFFIX}"))


def test_metrics_count_blocks_written_while_the_engine_idles(tiny_tokenizer, tmp_path):
    model = build_model("qwen3")
    gate = threading.Event()  # the writer waits for it: every write lands after the last step

    def load() -> Engine:
        config = EngineConfig(num_blocks=64, block_size=8, disk_cache_dir=str(tmp_path))
        engine = Engine(model, tiny_tokenizer, config)
        assert engine.kv.disk is not None
        write = engine.kv.disk.files.write
        engine.kv.disk.files.write = lambda digest, payload: (  # type: ignore[method-assign]
            gate.wait(30),
            write(digest, payload),
        )[1]
        return engine

    thread = EngineThread(load).start()
    thread.wait_ready(timeout=60)
    try:
        with serving(thread) as served:
            prompt = np.random.default_rng(5).integers(3, VOCAB_SIZE, size=45).tolist()
            done = threading.Event()
            thread.submit(prompt, GREEDY, lambda out: out.finished and done.set())
            assert done.wait(60)
            before = scrape(served)
            gate.set()
            deadline = time.monotonic() + 30
            while len(_files(tmp_path)) < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            files = _files(tmp_path)
            assert len(files) == 5  # the prompt's 5 full blocks
            deadline = time.monotonic() + 10
            after = scrape(served)
            while after["macbatch_disk_cache_written_blocks_total"] < 5:
                assert time.monotonic() < deadline, after
                time.sleep(0.05)
                after = scrape(served)
    finally:
        thread.shutdown()
    assert before["macbatch_disk_cache_written_blocks_total"] == 0
    assert after["macbatch_disk_cache_written_bytes_total"] == sum(f.stat().st_size for f in files)
    assert after["macbatch_disk_cache_blocks"] == 5
