"""EngineThread: the engine loop on its own thread, so UIs on asyncio (or any other thread) can
submit, stream and cancel requests while every MLX call stays on one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from macbatch.engine.engine import Engine, EngineStats, Prompt
from macbatch.engine.request import FinishReason, RequestMetrics, RequestOutput
from macbatch.engine.sampling import SamplingParams

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]


class EngineDeadError(RuntimeError):
    """The engine thread is not running (it failed to load, crashed, or was shut down)."""


class EngineThread:
    def __init__(self, loader: Callable[[], Engine], name: str = "macbatch-engine") -> None:
        self._loader = loader
        self._commands: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._callbacks: dict[str, OutputCallback] = {}
        self._ready = threading.Event()
        self._loop_done = threading.Event()
        self._engine: Engine | None = None
        self._stats: EngineStats | None = None
        self._stopped = False
        self.error: BaseException | None = None
        self.engine_info: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> EngineThread:
        self._thread.start()
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
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._loop_done.wait(timeout)
        self._stopped = True

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (plain Python, safe to use from any thread)."""
        return self._live_engine().tokenizer

    # -- requests ----------------------------------------------------------------------------

    def encode_prompt(
        self, prompt: Prompt, chat_template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The prompt's token ids, as a request would get them (tokenizer work only: safe here)."""
        return self._live_engine().encode_prompt(prompt, chat_template_kwargs)

    def context_limit(self) -> int:
        """The most tokens one sequence may hold (`Engine.context_limit`; plain Python, safe)."""
        return self._live_engine().context_limit()[0]

    async def prepare_constraints(self) -> None:
        """Build the engine's grammar index (1-3 s, once) on a worker thread before a first
        constrained request is submitted, so the caller's event loop keeps answering."""
        compiler = self._live_engine().constraints
        if not compiler.ready:
            await asyncio.to_thread(compiler.prepare)

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        on_output: OutputCallback | None = None,
        request_id: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Queue a request; ``on_output`` runs on the engine thread for every output."""
        engine = self._live_engine()
        request = engine.prepare_request(
            prompt, params or SamplingParams(), request_id, chat_template_kwargs, tools
        )
        self._commands.put(("add", request, on_output))
        return request.request_id

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; leaving the loop early cancels the request."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def deliver(out: RequestOutput) -> None:
            # RuntimeError: the consumer's loop is gone; the request is cancelled below.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(outputs.put_nowait, out)

        rid = self.submit(prompt, params, deliver, request_id, chat_template_kwargs)
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.cancel(rid)

    def cancel(self, request_id: str) -> None:
        self._commands.put(("cancel", request_id))

    def abort_all(self) -> None:
        """Abort every request in flight; each listener still gets its final output
        (finish_reason ABORT), so a server can end its responses properly. The loop goes on."""
        self._commands.put(("abort_all",))

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between steps; its result comes in a Future."""
        self._live_engine()
        future: Future = Future()
        self._commands.put(("call", fn, future))
        return future

    def stats(self) -> EngineStats | None:
        """The snapshot taken after the last step (plain data, safe from any thread)."""
        return self._stats

    def _live_engine(self) -> Engine:
        if not self.alive:
            why = f": {self.error}" if self.error else ""
            raise EngineDeadError(f"the engine is not running{why}")
        assert self._engine is not None
        return self._engine

    # -- the loop (engine thread only) -------------------------------------------------------

    def _run(self) -> None:
        self._serve()
        self._loop_done.set()
        # Park instead of returning: with MLX 0.32 on CPU, a thread that used MLX and then ends
        # makes the process abort at exit ("terminate called without an active exception").
        # The thread is a daemon, so parking it never blocks the process from exiting.
        threading.Event().wait()

    def _serve(self) -> None:
        try:
            engine = self._engine = self._loader()
        except BaseException as exc:  # report any load failure to the waiting caller
            self.error = exc
            self._ready.set()
            return
        self.engine_info = {
            "model_name": engine.model_name,
            "model_type": engine.adapter.model_type,
            "kv_blocks_total": engine.pool.num_blocks,
            "block_size": engine.config.block_size,
            "max_model_len": engine.max_model_len,
        }
        self._stats = engine.stats()
        self._ready.set()
        try:
            while self._handle_commands(engine, block=not engine.has_unfinished()):
                if engine.has_unfinished():
                    self._deliver(engine.step())
                    self._stats = engine.stats()
        except BaseException as exc:
            log.exception("engine loop failed")
            self.error = exc
            self._fail_everything(f"the engine failed: {exc!r}")

    def _handle_commands(self, engine: Engine, block: bool) -> bool:
        """Apply queued commands; False once asked to stop."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            kind = command[0]
            if kind == "add":
                _, request, callback = command
                if callback is not None:
                    self._callbacks[request.request_id] = callback
                engine.enqueue(request)
            elif kind == "cancel":
                engine.abort(command[1])
            elif kind == "call":
                _, fn, future = command
                try:
                    future.set_result(fn(engine))
                except Exception as exc:
                    future.set_exception(exc)
            elif kind == "abort_all":
                self._abort_all(engine)
            elif kind == "stop":
                self._abort_all(engine)
                engine.close()
                self._stopped = True
                return False

    def _abort_all(self, engine: Engine) -> None:
        """Abort every request that has a listener and hand each its final (ABORT) output."""
        for rid in list(self._callbacks):
            engine.abort(rid)
        self._deliver(engine.step())
        self._stats = engine.stats()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            callback = self._callbacks.get(out.request_id)
            if out.finished:
                self._callbacks.pop(out.request_id, None)
            if callback is None:
                continue
            try:
                callback(out)
            except Exception:
                log.exception("output callback for request %s failed", out.request_id)

    def _fail_everything(self, message: str) -> None:
        """After a crash, finish every known request with an error so no caller hangs."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add" and command[2] is not None:
                self._callbacks[command[1].request_id] = command[2]
            elif command[0] == "call":
                command[2].set_exception(EngineDeadError(message))
        now = time.monotonic()
        self._deliver(
            [
                RequestOutput(
                    request_id=rid,
                    token_ids=[],
                    new_token_ids=[],
                    finished=True,
                    finish_reason=FinishReason.ERROR,
                    metrics=RequestMetrics(arrival_time=now, finished_time=now),
                    step=-1,
                    error=message,
                )
                for rid in list(self._callbacks)
            ]
        )
