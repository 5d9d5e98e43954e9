"""EngineThread: the engine loop on a thread of its own (reused by the next engine once the loop
ends: host_threads.py), so UIs on asyncio (or any other thread) can submit, stream and cancel
requests while every MLX call stays on one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from macbatch.engine.core.outputs import FinishReason, RequestMetrics, RequestOutput
from macbatch.engine.core.request import Request
from macbatch.engine.core.stats import EngineStats
from macbatch.engine.device import OwnDevice, Turns
from macbatch.engine.encoder.engine import EncoderEngine
from macbatch.engine.encoder.requests import EncoderTokenizer
from macbatch.engine.engine import Engine
from macbatch.engine.host_threads import run_loop
from macbatch.engine.inputs.processor import Processor, PromptEncoder, prompt_input
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.loop_handoff import held_posts, post_to_loop
from macbatch.engine.model_info import EngineInfo
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]
# what a thread drives: the paged engine, or an encoder's (engine/encoder/engine.py)
AnyEngine = Engine | EncoderEngine
LIVENESS_CHECK_S = 0.5  # how often a waiting stream checks that the engine thread is alive


class EngineDeadError(RuntimeError):
    """The engine thread is not running (it failed to load, crashed, or was shut down)."""


# The commands other threads queue for the engine thread, applied between steps.


@dataclass(frozen=True)
class _Add:
    """Queue a request the caller's thread already processed; its outputs go to `on_output`."""

    request: Request
    on_output: OutputCallback | None


@dataclass(frozen=True)
class _Cancel:
    """Abort one request (its final output still reaches its listener)."""

    request_id: str


@dataclass(frozen=True)
class _Call:
    """Run `fn` on the engine between steps; its result or exception goes to `future`."""

    fn: Callable[[Any], Any]  # given the engine: its caller knows which kind it loaded
    future: Future[Any]


@dataclass(frozen=True)
class _AbortAll:
    """Abort every request with a listener (the server's shutdown deadline); the loop goes on."""


@dataclass(frozen=True)
class _Stop:
    """Abort everything, let the other ranks go, and end the loop."""


_Command = _Add | _Cancel | _Call | _AbortAll | _Stop


class EngineThread(PromptEncoder):
    """``device``: the turns of the device this engine shares with others (engine/device.py);
    its load, steps, calls and close each run in a turn, its host bookkeeping in none."""

    def __init__(
        self,
        loader: Callable[[], AnyEngine],
        name: str = "macbatch-engine",
        device: Turns | None = None,
    ) -> None:
        self._loader = loader
        self._device: Turns | OwnDevice = device or OwnDevice()
        self._name = name
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._callbacks: dict[str, OutputCallback] = {}
        self._ready = threading.Event()
        self._loop_done = threading.Event()
        self._engine: AnyEngine | None = None
        self._stats: EngineStats | None = None
        self._stopped = False
        # When an idle elastic pool shrinks: kv_shrink_after_s after the last step (None: no
        # step since it last shrank, or it never does).
        self._shrink_at: float | None = None
        self.error: BaseException | None = None
        self._info: EngineInfo | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> EngineThread:
        """Start the loop on a host thread another engine's ended loop left idle, or a new one
        (engine/host_threads.py: why threads are reused)."""
        if self._started:
            raise RuntimeError("an engine thread starts once")
        self._started = True
        run_loop(self._run, self._name, self._loop_done)
        return self

    @property
    def _running(self) -> bool:
        return self._started and not self._loop_done.is_set()

    def share_device(self, device: Turns) -> EngineThread:
        """Take turns of ``device`` with the engines already on it; before ``start`` only (a
        front end handed a thread built elsewhere, such as chat's first model)."""
        if self._running or self._ready.is_set():
            raise RuntimeError("an engine thread shares a device from its start only")
        self._device = device
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the model is loaded; re-raises the loader's exception if it failed."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the engine did not finish loading in time")
        if self._engine is None and self.error is not None:
            raise self.error

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._engine is not None

    @property
    def alive(self) -> bool:
        running = not (self._stopped or self._loop_done.is_set())
        return self.ready and self.error is None and running

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Abort whatever is in flight and stop the loop."""
        if self._running:
            self._commands.put(_Stop())
            self._loop_done.wait(timeout)
        self._stopped = True

    @property
    def info(self) -> EngineInfo:
        """The model's and the KV pool's facts (plain data, safe from any thread; readable after
        a crash too). ``EngineDeadError`` before the model has loaded."""
        if self._info is None:
            raise EngineDeadError("the engine has not loaded a model")
        return self._info

    @property
    def tokenizer(self) -> TokenizerWrapper | EncoderTokenizer:
        """The model's tokenizer (plain Python, safe to use from any thread)."""
        return self._live_engine().tokenizer

    # -- requests ----------------------------------------------------------------------------

    def _processor(self) -> Processor:
        return self._live_engine().processor  # plain Python: safe from any thread

    def images_refused(self) -> str | None:
        """Why the model cannot read images (None: it can; plain Python, safe from any thread)."""
        return self._processor().vision.refusal

    def context_limit(self) -> int:
        """The most tokens one sequence may hold (`Engine.context_limit`; plain Python, safe)."""
        return self.info.context_limit

    async def prepare_constraints(self) -> None:
        """Build the engine's grammar index (1-3 s, once) on a worker thread before a first
        constrained request is submitted, so the caller's event loop keeps answering."""
        engine = self._live_engine()
        if isinstance(engine, EncoderEngine):
            return  # an encoder's requests are never constrained: it does not generate
        compiler = engine.constraints
        if not compiler.ready:
            await asyncio.to_thread(compiler.prepare)

    def submit(
        self,
        prompt: Prompt | PromptInput,
        params: SamplingParams | PoolingParams | None = None,
        on_output: OutputCallback | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; ``on_output`` runs on the engine thread for every output. Bad input
        raises ``ValueError`` here; a request id already in use gets a final ERROR output."""
        request = self.prepare(prompt_input(prompt), params or SamplingParams(), request_id)
        return self.enqueue(request, on_output)

    def prepare(
        self,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None = None,
    ) -> Request:
        """Template, tokenize and check a request (``ValueError`` on bad input) on the calling
        thread, any thread, to ``enqueue`` later: ``submit`` in two halves."""
        return self._live_engine().processor.process(prompt, params, request_id)

    def enqueue(self, request: Request, on_output: OutputCallback | None = None) -> str:
        """Queue a prepared request (``prepare``); returns its id."""
        self._live_engine()
        self._commands.put(_Add(request, on_output))
        return request.request_id

    async def stream(
        self,
        prompt: Prompt | PromptInput,  # a PromptInput carries the template variables and tools
        params: SamplingParams | PoolingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; leaving the loop early cancels the request."""
        request = self.prepare(prompt_input(prompt), params or SamplingParams(), request_id)
        outputs = self.stream_prepared([request])
        try:
            async for _, out in outputs:
                yield out
        finally:
            outputs.close()

    def stream_prepared(self, requests: Sequence[Request]) -> OutputStream:
        """Queue prepared requests (``prepare``: a server tokenizes off its event loop) now, and
        stream their outputs; the caller closes the stream."""
        return OutputStream(self, requests, asyncio.get_running_loop())

    def cancel(self, request_id: str) -> None:
        self._commands.put(_Cancel(request_id))

    def abort_all(self) -> None:
        """Abort every request in flight; each listener still gets its final output
        (finish_reason ABORT), so a server can end its responses properly. The loop goes on."""
        self._commands.put(_AbortAll())

    def call(self, fn: Callable[[Any], Any]) -> Future[Any]:
        """Run ``fn(engine)`` on the engine thread between steps; its result comes in a Future."""
        self._live_engine()
        future: Future[Any] = Future()
        self._commands.put(_Call(fn, future))
        return future

    def stats(self) -> EngineStats | None:
        """The snapshot taken after the last step (plain data, safe from any thread), with the
        disk tier's counts as they are now: its writer and readers work between steps, and
        the last blocks of a reply are written after the engine's last step, while it idles."""
        stats, engine = self._stats, self._engine
        if stats is None or not isinstance(engine, Engine) or engine.kv.disk is None:
            return stats
        return dataclasses.replace(stats, disk=engine.kv.disk.counts())

    def _live_engine(self) -> AnyEngine:
        if not self.alive:
            why = f": {self.error}" if self.error else ""
            raise EngineDeadError(f"the engine is not running{why}")
        assert self._engine is not None
        return self._engine

    # -- the loop (engine thread only) -------------------------------------------------------

    def _run(self) -> None:
        self._serve()
        if self._stopped:  # shut down: the weights and pages go now, not with the next loop
            self._engine = None
            with self._turn():
                _hand_back_buffers()

    def _serve(self) -> None:
        try:
            with self._turn():
                engine = self._engine = self._loader()
        except BaseException as exc:  # report any load failure to the waiting caller
            self.error = exc
            self._ready.set()
            return
        self._info = engine.info
        self._stats = engine.stats()
        self._ready.set()
        try:
            while self._handle_commands(engine, self._idle_wait(engine)):
                if engine.has_unfinished():
                    with self._turn():
                        outputs = engine.step()
                    # the snapshot first: a listener woken by a reply's end reads the stats at once
                    self._stats = engine.stats()
                    self._deliver(outputs)
                    self._shrink_at = _shrink_deadline(engine)
                elif self._shrink_at is not None and time.monotonic() >= self._shrink_at:
                    self._shrink_at = None
                    with self._turn():
                        shrunk = engine.shrink_pool()
                    if shrunk:
                        self._stats = engine.stats()
        except BaseException as exc:
            log.exception("engine loop failed")
            self.error = exc
            self._fail_everything(f"the engine failed: {exc!r}")

    def _idle_wait(self, engine: AnyEngine) -> float | None:
        """How long to wait for a command: not at all while there is work; while idle, until
        the pool is due to shrink, then for as long as it takes (None)."""
        if engine.has_unfinished():
            return 0.0
        if self._shrink_at is None:
            return None
        return max(0.0, self._shrink_at - time.monotonic())

    def _handle_commands(self, engine: AnyEngine, wait: float | None) -> bool:
        """Apply queued commands, waiting up to ``wait`` seconds for the first (None: for as
        long as it takes); False once asked to stop."""
        block = wait != 0.0
        while True:
            try:
                command = self._commands.get(block=block, timeout=wait if block else None)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Add):
                self._add(engine, command)
            elif isinstance(command, _Cancel):
                engine.abort(command.request_id)
            elif isinstance(command, _Call):
                try:
                    with self._turn():
                        result = command.fn(engine)
                except Exception as exc:
                    command.future.set_exception(exc)
                else:
                    command.future.set_result(result)
            elif isinstance(command, _AbortAll):
                self._abort_all(engine)
            else:
                self._abort_all(engine)
                with self._turn():
                    engine.close()
                self._stopped = True
                return False

    def _add(self, engine: AnyEngine, command: _Add) -> None:
        rid = command.request.request_id
        try:
            engine.enqueue(command.request)
        except ValueError as exc:  # its id is in use: the request already queued keeps its own
            if command.on_output is not None:
                _safely(command.on_output, _error_output(rid, str(exc)))
            return
        if command.on_output is not None:
            self._callbacks[rid] = command.on_output

    def _abort_all(self, engine: AnyEngine) -> None:
        """Abort every request that has a listener and hand each its final (ABORT) output."""
        for rid in list(self._callbacks):
            engine.abort(rid)
        with self._turn():
            outputs = engine.step()
        self._stats = engine.stats()
        self._deliver(outputs)

    def _turn(self) -> contextlib.AbstractContextManager[None]:
        """A turn of the device for MLX work (at once when the engine is alone on it)."""
        return self._device.turn(self._name)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Run the callbacks of a step's outputs; what they post to event loops wakes each
        loop once, after the last (engine/loop_handoff.py)."""
        with held_posts():
            for out in outputs:
                callback = self._callbacks.get(out.request_id)
                if out.finished:
                    self._callbacks.pop(out.request_id, None)
                if callback is not None:
                    _safely(callback, out)

    def _fail_everything(self, message: str) -> None:
        """After a crash, finish every known request with an error so no caller hangs."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add) and command.on_output is not None:
                self._callbacks[command.request.request_id] = command.on_output
            elif isinstance(command, _Call):
                command.future.set_exception(EngineDeadError(message))
        self._deliver([_error_output(rid, message) for rid in list(self._callbacks)])


class OutputStream:
    """The outputs of requests queued together, ``(position, output)`` in arrival order, until
    each has finished. ``close()`` cancels those not finished; it is synchronous and idempotent,
    so it also runs under cancellation (a client gone mid-stream). ``EngineDeadError`` if the
    engine thread is found gone while waiting."""

    def __init__(
        self, thread: EngineThread, requests: Sequence[Request], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._thread = thread
        self._ids = [request.request_id for request in requests]
        self._outputs: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self._unfinished: set[int] = set()
        for index, request in enumerate(requests):
            thread.enqueue(request, self._deliver(loop, index))
            self._unfinished.add(index)

    def _deliver(self, loop: asyncio.AbstractEventLoop, index: int) -> OutputCallback:
        def on_output(out: RequestOutput) -> None:
            # RuntimeError: the consumer's loop is gone; its request is cancelled by close().
            with contextlib.suppress(RuntimeError):
                post_to_loop(loop, self._outputs.put_nowait, (index, out))

        return on_output

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        while self._unfinished:
            index, out = await self._next_output()
            if index not in self._unfinished:
                continue  # a late output of a request already cancelled
            if out.finished:
                self._unfinished.discard(index)
            return index, out
        raise StopAsyncIteration

    async def _next_output(self) -> tuple[int, RequestOutput]:
        """The next output, checking every ``LIVENESS_CHECK_S`` that the engine thread lives.
        Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that arrives as the
        output does, and a stopped stream would run on."""
        if not self._outputs.empty():
            return self._outputs.get_nowait()
        get = asyncio.ensure_future(self._outputs.get())
        try:
            while not (await asyncio.wait({get}, timeout=LIVENESS_CHECK_S))[0]:
                if not self._thread.alive:
                    raise EngineDeadError("the engine thread stopped")
        finally:
            get.cancel()
        return get.result()

    def close(self) -> None:
        unfinished, self._unfinished = self._unfinished, set()
        for index in sorted(unfinished):
            self._thread.cancel(self._ids[index])


def _hand_back_buffers() -> None:
    """A stopped engine's arrays go now, then MLX's freed buffers go back to the system. An
    engine holds reference cycles, which only the cyclic collector frees: without it every
    model unloaded kept its weights and pages until some later collection (``benchmarks/soak.py``
    saw MLX's active memory climb a model's worth per unload, 39 to 155 MiB)."""
    import gc

    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _shrink_deadline(engine: AnyEngine) -> float | None:
    after = engine.config.kv_shrink_after_s
    if after is None:  # a fixed pool does not shrink, but the heap's free buffers go back
        return None
    return time.monotonic() + after


def _error_output(request_id: str, message: str) -> RequestOutput:
    """The final output of a request the engine could not run."""
    now = time.monotonic()
    return RequestOutput(
        request_id=request_id,
        token_ids=[],
        new_token_ids=[],
        finished=True,
        finish_reason=FinishReason.ERROR,
        metrics=RequestMetrics(arrival_time=now, finished_time=now),
        step=-1,
        error=message,
    )


def _safely(callback: OutputCallback, out: RequestOutput) -> None:
    try:
        callback(out)
    except Exception:
        log.exception("output callback for request %s failed", out.request_id)
