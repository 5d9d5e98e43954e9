"""A client that goes away mid-request cancels its engine request, and the very next engine step
runs with its KV blocks already free."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from macbatch.engine import Engine
from tests.support.live_server import Served, serving, start_engine
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until

LONG = {"prompt": "how are you today?", "max_tokens": 3000, "temperature": 0}


@dataclass
class Recorder:
    """Seen from inside the engine thread: each abort, and KV use after every step."""

    aborts: list[tuple[str, int]] = field(default_factory=list)  # (request id, steps seen before)
    after_step: list[int] = field(default_factory=list)  # kv blocks used after each step

    def wrap(self, engine: Engine) -> Engine:
        abort, step = engine.abort, engine.step

        def recording_abort(request_id: str) -> None:
            self.aborts.append((request_id, len(self.after_step)))
            abort(request_id)

        def recording_step():
            outputs = step()
            self.after_step.append(engine.stats().kv_blocks_used)
            return outputs

        engine.abort, engine.step = recording_abort, recording_step
        return engine


@pytest.fixture(scope="module")
def recorded(tiny_model_path: Path) -> Iterator[tuple[Served, Recorder]]:
    recorder = Recorder()
    thread = start_engine(tiny_model_path, recorder.wrap)
    with serving(thread) as server:
        yield server, recorder
    thread.shutdown()


def _freed_on_next_step(recorder: Recorder) -> None:
    assert wait_until(lambda: len(recorder.aborts) == 1, timeout=5)
    _, steps_before_abort = recorder.aborts[0]
    assert wait_until(lambda: len(recorder.after_step) > steps_before_abort, timeout=5)
    assert recorder.after_step[steps_before_abort] == 0  # the first step after the abort


def test_stream_disconnect_frees_blocks(recorded: tuple[Served, Recorder]) -> None:
    server, recorder = recorded
    recorder.aborts.clear()
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", server.api + "/completions", json={**LONG, "stream": True}) as r,
    ):
        lines = r.iter_lines()
        received = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(received) >= 3
        assert server.thread.stats().kv_blocks_used > 0
        closed_at = time.monotonic()
    _freed_on_next_step(recorder)
    assert time.monotonic() - closed_at < 10  # generous; the step count below is the bound
    assert len(recorder.after_step) < LONG["max_tokens"] / 2  # it did not run to the end
    assert scrape(server)['macbatch_requests_total{finish_reason="abort"}'] == 1
    assert scrape(server)["macbatch_requests_pending"] == 0


def test_non_streaming_disconnect_frees_blocks(recorded: tuple[Served, Recorder]) -> None:
    server, recorder = recorded
    recorder.aborts.clear()
    assert wait_until(lambda: server.thread.stats().kv_blocks_used == 0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.api + "/completions", json={**LONG, "n": 2}, timeout=0.5)
    assert wait_until(lambda: len(recorder.aborts) == 2, timeout=5)
    steps_before = min(seen for _, seen in recorder.aborts)
    assert wait_until(lambda: len(recorder.after_step) > max(s for _, s in recorder.aborts))
    assert recorder.after_step[max(s for _, s in recorder.aborts)] == 0
    assert steps_before < LONG["max_tokens"] / 2
