"""Engines sharing one device (issue 49): an ``EngineThread`` given the device's ``Turns`` takes a
turn for each piece of MLX work itself (its load, every step, its close), waits while another
holds the device, and drops its engine once shut down."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, EngineThread, RequestOutput, SamplingParams, Turns


def test_an_engine_thread_takes_the_device_for_its_mlx_work(tiny_model_path: Path) -> None:
    turns = Turns(keep_log=True)
    config = EngineConfig(num_blocks=64)
    thread = EngineThread(
        lambda: Engine.load(str(tiny_model_path), config), name="tiny", device=turns
    ).start()
    thread.wait_ready()
    assert turns.log == [("tiny", False)]  # the load
    outputs: list[RequestOutput] = []
    done = threading.Event()

    def collect(output: RequestOutput) -> None:
        outputs.append(output)
        if output.finished:
            done.set()

    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    with turns.turn("another engine"):
        thread.submit("hello world", params, collect)  # queued: host work takes no turn
        time.sleep(0.2)
        assert outputs == []  # no step while another engine has the device
    assert done.wait(30)
    assert sum(o.finished for o in outputs) == 1 and len(outputs[-1].token_ids) == 5
    steps = [owner for owner, _ in turns.log[2:]]
    assert len(steps) >= 5 and set(steps) == {"tiny"}  # at least a step per token, each a turn
    before = len(turns.log)
    thread.shutdown(timeout=30)
    assert len(turns.log) > before and turns.log[-1][0] == "tiny"  # its close, in a turn
    assert not thread.ready  # the engine (weights and pages) was dropped


def test_a_device_is_shared_from_the_start_only(tiny_model_path: Path) -> None:
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), EngineConfig(num_blocks=64)))
    thread.share_device(Turns()).start()
    thread.wait_ready()
    with pytest.raises(RuntimeError, match="from its start only"):
        thread.share_device(Turns())
    thread.shutdown()
