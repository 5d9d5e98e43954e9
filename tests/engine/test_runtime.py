"""EngineThread: asyncio streaming, cancellation, load failures and crashes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from pathlib import Path

import pytest

from macbatch.engine import (
    Engine,
    EngineConfig,
    EngineDeadError,
    EngineThread,
    FinishReason,
    SamplingParams,
    post_to_loop,
)
from macbatch.engine.host_threads import host_count
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import build_model

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture
def model():
    return build_model("qwen3")


@pytest.fixture
def thread(model, tiny_tokenizer):
    t = EngineThread(lambda: Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64)))
    t.start()
    t.wait_ready(timeout=60)
    yield t
    t.shutdown()


async def _collect(thread, prompt, params=GREEDY):
    return [out async for out in thread.stream(prompt, params)]


async def test_concurrent_streams_share_steps(thread, model):
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12]]
    results = await asyncio.gather(*(_collect(thread, p) for p in prompts))
    for prompt, outs in zip(prompts, results):
        assert outs[-1].finished
        assert [t for o in outs for t in o.new_token_ids] == mlx_lm_greedy(model, prompt, 8)
    steps = [{o.step for o in outs} for outs in results]
    assert steps[0] & steps[1] & steps[2], "the three requests never ran in the same step"


async def test_a_steps_outputs_wake_the_loop_once(thread, model):
    """Eight streams: a step's eight outputs reach the event loop in one wake-up, not one
    each (``loop_handoff``), and every stream still gets mlx-lm's tokens in order."""
    loop = asyncio.get_running_loop()
    wakeups = 0
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(*args, **kwargs):
        nonlocal wakeups
        wakeups += 1
        return call_soon_threadsafe(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    prompts = [[5 + i, 6, 7] for i in range(8)]
    try:
        results = await asyncio.gather(*(_collect(thread, p) for p in prompts))
    finally:
        del loop.call_soon_threadsafe
    for prompt, outs in zip(prompts, results):
        assert [t for o in outs for t in o.new_token_ids] == mlx_lm_greedy(model, prompt, 8)
    outputs = sum(len(outs) for outs in results)
    steps = len({o.step for outs in results for o in outs})
    assert outputs >= 64 and wakeups <= steps, (wakeups, steps, outputs)


def test_posting_to_a_closed_loop_raises_and_forgets_the_call():
    """``post_to_loop`` on a closed loop raises as ``call_soon_threadsafe`` does; the call is
    dropped, so a post to the next loop runs alone."""
    closed = asyncio.new_event_loop()
    closed.close()
    ran = []
    with pytest.raises(RuntimeError):
        post_to_loop(closed, ran.append, "lost")
    loop = asyncio.new_event_loop()
    try:
        post_to_loop(loop, ran.append, "kept")
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert ran == ["kept"]


async def test_leaving_a_stream_cancels_and_frees(thread):
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    async with contextlib.aclosing(thread.stream([5, 6, 7], params)) as stream:
        async for out in stream:
            if len(out.token_ids) >= 3:
                break
    used = await asyncio.wrap_future(
        thread.call(lambda e: (e.has_unfinished() or e.step(), e.stats().kv_blocks_used)[1])
    )
    assert used == 0


async def test_bad_input_raises_on_the_caller(thread):
    with pytest.raises(ValueError, match="prompt is empty"):
        await _collect(thread, [])
    outs = await _collect(thread, [5, 6])
    assert outs[-1].finish_reason == FinishReason.LENGTH


def test_successive_engines_reuse_one_host_thread(model, tiny_tokenizer):
    """Loading and unloading an engine eight times, one at a time, starts at most one host
    thread: a thread per load would keep each parked, with its malloc arena and MLX's per-thread
    streams (the soak benchmark's RSS grew a model's worth per load). A failed load gives its
    host back too, and every engine still answers as mlx-lm does."""
    before, os_threads = host_count(), threading.active_count()
    expected = mlx_lm_greedy(model, [5, 6, 7], 8)
    for cycle in range(8):
        if cycle == 3:
            failed = EngineThread(_broken).start()
            with pytest.raises(ValueError, match="no such model"):
                failed.wait_ready(timeout=10)
            failed.shutdown(timeout=None)
        t = EngineThread(lambda: Engine(model, tiny_tokenizer, EngineConfig(num_blocks=16)))
        t.start().wait_ready(timeout=60)
        outputs: queue.Queue = queue.Queue()
        t.submit([5, 6, 7], GREEDY, outputs.put)
        tokens = []
        while not (out := outputs.get(timeout=60)).finished:
            tokens += out.new_token_ids
        assert tokens + out.new_token_ids == expected
        t.shutdown(timeout=None)
        assert not t.alive
    assert host_count() <= before + 1
    assert threading.active_count() <= os_threads + 1


def test_engines_at_once_take_a_host_each_and_give_them_back(model, tiny_tokenizer):
    def start() -> EngineThread:
        t = EngineThread(lambda: Engine(model, tiny_tokenizer, EngineConfig(num_blocks=16)))
        t.start().wait_ready(timeout=60)
        return t

    before, os_threads = host_count(), threading.active_count()
    for _ in range(3):
        pair = [start(), start()]
        assert all(t.alive for t in pair)
        for t in pair:
            t.shutdown(timeout=None)
    assert host_count() <= before + 2
    assert threading.active_count() <= os_threads + 2


def _broken() -> Engine:
    raise ValueError("no such model")


def test_load_failure_is_reported():
    t = EngineThread(_broken).start()
    with pytest.raises(ValueError, match="no such model"):
        t.wait_ready(timeout=10)
    with pytest.raises(EngineDeadError):
        t.submit([1, 2], GREEDY)


async def test_crash_fails_in_flight_requests(thread, model):
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    await asyncio.wrap_future(thread.call(lambda e: setattr(e.runner.adapter, "forward", explode)))
    outs = await asyncio.wait_for(_collect(thread, [5, 6, 7]), timeout=30)
    assert outs[-1].finish_reason == FinishReason.ERROR and "boom" in outs[-1].error
    assert not thread.alive
    with pytest.raises(EngineDeadError, match="boom"):
        thread.submit([1], GREEDY)


def test_process_exits_cleanly_after_shutdown(tiny_model_path, tmp_path):
    """MLX 0.32 on CPU aborts the process at exit if a thread that used MLX has ended; an
    engine's host thread never ends (engine/host_threads.py), so a front end that shuts the
    engine down exits with 0."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import queue
            from macbatch.engine import Engine, EngineConfig, EngineThread, SamplingParams
            t = EngineThread(lambda: Engine.load({str(tiny_model_path)!r},
                                                 EngineConfig(num_blocks=16))).start()
            t.wait_ready()
            outputs = queue.Queue()
            t.submit([1, 2, 3], SamplingParams(max_tokens=3), outputs.put)
            while not outputs.get().finished:
                pass
            t.shutdown()
            print("done")
            """
        )
    )
    # The checkout first on the path, as for the suite itself: macbatch need not be installed.
    checkout = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert (result.returncode, result.stdout.strip()) == (0, "done"), result.stderr
