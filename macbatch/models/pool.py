"""The models one front end runs: which it can load, which are loaded, and when each loads and
unloads (docs/models.md).

Every servable model has a name (a request's ``model``, a chat's model); a request for one that is
not loaded loads it (requests for it meanwhile wait, at most ``max_waiting`` of them), after making
room: past ``max_loaded`` models, or when the memory guard says it would not fit in the memory free
now plus what unloading would give back, the least recently used idle models unload first. A model
is idle when nothing holds it (``lease``: serve's request holds its model until its response ends,
streams included; chat's reply until it ends). An idle model unloads ``keep_alive_s`` after its last
use, and under memory pressure (less than ``PRESSURE_FRACTION`` of the machine free) idle models
give their KV pools back and then unload, least recently used first. A model's fine-tunes
(``adapter_uses.py``) load into its engine when a request first names one, and unload the same
ways, before any model does (they are the cheapest to load again).

The pool's state lives on the front end's event loop (no locks): loading, unloading and shrinking
run on worker threads, and waiters await the load's future.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from macbatch.engine import EngineThread, Tokenizer, ToolFormat
from macbatch.models import adapter_uses
from macbatch.models.adapter_uses import AdapterUse, need_of_adapter, uses_of
from macbatch.models.memory import SERVE_UNLOAD, Memory, Need, need_of, refusal_now, too_large
from macbatch.openai import ImageAccess

MAX_REASON = 500  # characters of a load error a refusal carries (a 12,000-layer one was 4.7 MB)
log = logging.getLogger("macbatch.models.local")
PRESSURE_FRACTION = 0.05  # under this much of the machine free, idle models give memory back
REAP_EVERY_S = 1.0  # how often keep-alive and memory pressure are looked at


def resolved_or_none(requested: str) -> str:
    """The model a short name or a preset means (``models/names.py``), or "" when none: a
    client may name a served model as the command line does."""
    from macbatch.models.names import resolve

    try:
        return resolve(requested).model
    except ValueError:  # UnknownModel, PresetError: no servable name
        return ""


class ModelRefused(Exception):
    """A model the pool cannot give now, and why; ``status`` is the HTTP status serve answers
    (404 unknown, 400 cannot load, 429 too many waiting, 503 busy: retry after
    ``retry_after`` seconds)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        retry_after: int | None = None,
        param: str | None = "model",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.retry_after, self.param = retry_after, param


@dataclass(frozen=True)
class Servable:
    """A model the server may load: the name clients send, what ``Engine.load`` takes, and the
    local directory whose size the memory guard reads (None: a hub id named on the command line,
    downloaded when it loads)."""

    name: str
    source: str
    path: Path | None
    aliases: tuple[str, ...] = ()
    adapters: tuple[tuple[str, str], ...] = ()  # (name, directory): loaded with it (engine/lora)
    found: tuple[tuple[str, str], ...] = ()  # its fine-tunes under --models-dir: on first use

    @property
    def adapter_paths(self) -> dict[str, str]:
        """Every adapter a request may name with it -> its directory."""
        return dict(self.found) | dict(self.adapters)

    def adapter_names(self) -> dict[str, str]:
        """What a request's ``model`` may say to name one of its adapters -> the adapter:
        ``base:adapter`` (by any of the model's names) or the adapter's own name."""
        names = {name: name for name in self.adapter_paths}
        for alias in (self.name, *self.aliases):
            names |= {f"{alias}:{name}": name for name in self.adapter_paths}
        return names


@dataclass
class Loaded:
    """One loaded model, as the routes use it."""

    model_id: str
    thread: EngineThread
    decoder: Tokenizer
    images: ImageAccess  # the server's image rules, refused if this model takes no images
    need: Need  # what the guard counted for it when it loaded
    leases: int = 0  # requests (and serve's Batch API) holding it
    last_used: float = field(default_factory=time.monotonic)
    pinned: bool = False  # never unloaded (the Batch API's model)
    adapters: dict[str, AdapterUse] = field(default_factory=dict)  # its fine-tunes loaded now

    @property
    def tool_format(self) -> ToolFormat | None:
        return self.thread.info.model.tool_format  # decided once, at load

    @property
    def idle(self) -> bool:
        return self.leases == 0 and not self.pinned


# builds and starts the engine thread of a servable model (on a worker thread); a thread that
# stops frees its engine itself
Starter = Callable[[Servable], EngineThread]


@dataclass(frozen=True)
class PoolLimits:
    keep_alive_s: float | None = 300.0  # None: never unload for idleness
    max_loaded: int | None = None  # None: as many as memory allows
    max_waiting: int = 256  # requests waiting for their model to load
    kv_start_mib: float = 256.0  # the smallest useful KV pool (EngineConfig.kv_start_mib)
    unload: str = SERVE_UNLOAD  # how the front end's user frees another model (memory.too_large)


class ModelPool:
    def __init__(
        self,
        catalog: list[Servable],
        starter: Starter | None,
        images: ImageAccess,
        limits: PoolLimits = PoolLimits(),
        memory: Callable[[], Memory] | None = None,
    ) -> None:
        self.catalog = {entry.name: entry for entry in catalog}
        models = {alias: e.name for e in catalog for alias in (e.name, *e.aliases)}
        # a model's own name wins over an adapter named the same
        self._adapters = {
            s: (e.name, a) for e in catalog for s, a in e.adapter_names().items() if s not in models
        }
        self._names = {said: name for said, (name, _) in self._adapters.items()} | models
        self.default = catalog[0].name
        self.loaded: dict[str, Loaded] = {}
        self._starter = starter
        self._images = images
        self.limits = limits
        self.memory = memory  # reads the machine's memory (None: no guard)
        self._loading: dict[str, asyncio.Future[Loaded]] = {}
        self._adapter_loads: dict[tuple[str, str], asyncio.Future[AdapterUse]] = {}
        self._waiting = 0
        self._reaper: asyncio.Task[None] | None = None
        self._one_load = asyncio.Lock()  # one load at a time decides what room there is

    # -- what the routes use ------------------------------------------------------------------

    def name_of(self, requested: str | None) -> str:
        """The servable name a request's ``model`` means (None: the first model); 404 if none."""
        if requested is None:
            return self.default
        name = self._names.get(requested) or self._names.get(resolved_or_none(requested))
        if name is None:
            raise ModelRefused(
                404,
                f"model {requested!r} is not served here; GET /v1/models lists the models this "
                "server can load (`macbatch pull` downloads one, docs/models.md)",
                "model_not_found",
            )
        return name

    def adapter_of(self, requested: str | None) -> str | None:
        """The adapter a request's ``model`` names (None: the base model)."""
        found = None if requested is None else self._adapters.get(requested)
        return None if found is None else found[1]

    async def lease(self, requested: str | None) -> Loaded:
        """The loaded model (and the adapter ``requested`` names, in it), held until
        ``give_back``; loads them first if needed (waiting for a load in progress)."""
        self._start_reaper()
        name = self.name_of(requested)
        while True:  # until it is loaded when this task runs (no await before the lease)
            loaded = self.loaded.get(name)
            # a crashed engine loads again when the pool can load (else the route answers 503)
            if loaded is not None and (loaded.thread.alive or self._starter is None):
                break
            await self._wait_for_load(name)
        loaded.leases += 1
        loaded.last_used = time.monotonic()
        adapter = self.adapter_of(requested)
        if adapter is not None:
            try:
                while (use := loaded.adapters.get(adapter)) is None:
                    await self._wait_for_adapter(loaded, adapter)
            except BaseException:
                self.give_back(loaded)
                raise
            use.leases += 1
            use.last_used = loaded.last_used
        return loaded

    def give_back(self, loaded: Loaded, adapter: str | None = None) -> None:
        """End a lease (``adapter``: the one its ``lease`` named)."""
        loaded.leases -= 1
        loaded.last_used = time.monotonic()
        use = None if adapter is None else loaded.adapters.get(adapter)
        if use is not None:
            use.leases -= 1
            use.last_used = loaded.last_used

    def add_loaded(self, loaded: Loaded) -> None:
        """A model the caller loaded itself (a test's engine, chat's first model)."""
        self.loaded[loaded.model_id] = loaded

    def loaded_model(
        self,
        thread: EngineThread,
        name: str,
        need: Need,
        decoder: Tokenizer | None = None,
    ) -> Loaded:
        """The routes' view of a started engine thread (``decoder``: its tokenizer, read from
        the engine unless given)."""
        if decoder is None:
            decoder = thread.call(lambda engine: engine.tokenizer).result(timeout=60)
        refused = thread.images_refused()
        images = replace(self._images, refused=refused)
        return Loaded(name, thread, decoder, images, need, adapters=uses_of(thread))

    # -- loading --------------------------------------------------------------------------------

    def load_now(self, name: str) -> Loaded:
        """Load before serving (no event loop yet, nothing to unload): refused (a
        ``ModelRefused`` that says why) if it does not fit in the memory free now."""
        entry = self.catalog[name]
        need = self._need(entry)
        reason = (
            None
            if self.memory is None
            else refusal_now(name, need, self.memory, self.limits.unload)
        )
        if reason is not None:
            raise ModelRefused(400, reason, "model_too_large")
        loaded = self.loaded[name] = self._start(entry, need)
        return loaded

    def _need(self, entry: Servable) -> Need:
        """The guard's estimate (nothing known of a hub id not downloaded yet)."""
        return need_of(entry.path, self.limits.kv_start_mib) if entry.path else Need(0, 0)

    async def _wait_for_load(self, name: str) -> Loaded:
        future = self._loading.get(name)
        if future is None:
            future = self._loading[name] = asyncio.get_running_loop().create_future()
            forget = partial(self._loading.pop, name)
            asyncio.ensure_future(_settle(future, self._load(name), forget))
        return await self._waited(future)

    async def _wait_for_adapter(self, loaded: Loaded, adapter: str) -> AdapterUse:
        key = (loaded.model_id, adapter)
        future = self._adapter_loads.get(key)
        if future is None:
            future = self._adapter_loads[key] = asyncio.get_running_loop().create_future()
            work = self._load_adapter(loaded, adapter)
            asyncio.ensure_future(_settle(future, work, partial(self._adapter_loads.pop, key)))
        return await self._waited(future)

    async def _waited(self, future: asyncio.Future[Any]) -> Any:
        """A load's result, counted among the waiters (429 past ``max_waiting``)."""
        if self._waiting >= self.limits.max_waiting:
            raise ModelRefused(
                429,
                f"{self._waiting} requests already wait for models to load; retry later",
                "queue_full",
                retry_after=1,
                param=None,
            )
        self._waiting += 1
        try:
            return await asyncio.shield(future)
        finally:
            self._waiting -= 1

    async def _load(self, name: str) -> Loaded:
        entry = self.catalog[name]
        stale = self.loaded.pop(name, None)  # a crashed engine: its memory goes first
        if stale is not None:
            await self._unload(stale)
        need = self._need(entry)
        async with self._one_load:
            await self._make_room(name, need)
            loaded = await asyncio.to_thread(self._start, entry, need)
        self.loaded[name] = loaded
        return loaded

    async def _load_adapter(self, loaded: Loaded, adapter: str) -> AdapterUse:
        label = f"{loaded.model_id}:{adapter}"
        path = self.catalog[loaded.model_id].adapter_paths[adapter]
        need = need_of_adapter(path)
        async with self._one_load:
            await self._room_for_adapter(label, need)
            log.info("loading adapter %s", label)
            try:
                use = await asyncio.to_thread(adapter_uses.load, loaded.thread, adapter, path)
            except Exception as exc:
                reason = f"cannot load adapter {label!r}: {type(exc).__name__}: {exc}"
                raise ModelRefused(400, reason, "model_unavailable") from None
        loaded.adapters[adapter] = use
        return use

    def _start(self, entry: Servable, need: Need) -> Loaded:
        """On a worker thread: check a local checkpoint's config against its weights (before
        the engine thread takes a turn of the device: the models serving meanwhile go on), then
        start the engine and wait for it. A refusal names the model, its reason cut short."""
        from macbatch.engine import check_checkpoint

        assert self._starter is not None, "this pool has no way to load models"
        log.info("loading model %s", entry.name)
        try:
            if entry.path is not None:
                check_checkpoint(entry.path)
            thread = self._starter(entry)
            thread.wait_ready()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if len(reason) > MAX_REASON:
                reason = reason[: MAX_REASON - 1] + "…"
            raise ModelRefused(
                400, f"cannot load model {entry.name!r}: {reason}", "model_unavailable"
            ) from None
        return self.loaded_model(thread, entry.name, need)

    async def _make_room(self, name: str, need: Need) -> None:
        """Unload idle models, least recently used first, until one more fits under
        ``max_loaded`` and ``need`` fits in the memory free now plus what they held."""
        most = self.limits.max_loaded
        while most is not None and sum(not m.pinned for m in self.loaded.values()) >= most:
            await self._unload(self._least_recent_idle(name, f"--max-loaded-models {most}"))
        await self._free_memory(name, need)

    async def _room_for_adapter(self, label: str, need: Need) -> None:
        """Unload idle adapters, least recently used first, until ``need`` fits in the memory
        free now; then idle models, if it still does not."""
        if self.memory is None or need.total == 0:
            return
        memory = await asyncio.to_thread(self.memory)
        freed, unload = 0, self.limits.unload
        for loaded, name, use in self._idle_adapters():
            if not too_large(label, need, memory.available + freed, memory, unload):
                return
            if await self._unload_adapter_if_idle(loaded, name):
                freed += use.nbytes
        if too_large(label, need, memory.available + freed, memory, unload):
            await self._free_memory(label, need)

    async def _free_memory(self, name: str, need: Need) -> None:
        """Unload idle models, least recently used first, until ``need`` fits in the memory
        free now plus what they held."""
        if self.memory is None or need.total == 0:
            return
        memory = await asyncio.to_thread(self.memory)
        freed = 0
        idle = sorted((m for m in self.loaded.values() if m.idle), key=lambda m: m.last_used)
        victims: list[Loaded] = []
        unload = self.limits.unload
        while too_large(name, need, memory.available + freed, memory, unload) and idle:
            victims.append(idle.pop(0))
            freed += victims[-1].need.total
        reason = too_large(name, need, memory.available + freed, memory, unload)
        if reason is not None:
            busy = sum(m.need.total for m in self.loaded.values() if m.leases and not m.pinned)
            room = memory.available + freed + busy
            if busy and not too_large(name, need, room, memory, unload):
                raise ModelRefused(
                    503,
                    f"{reason}; the models loaded now are answering requests: retry when "
                    "they are done",
                    "models_busy",
                    retry_after=5,
                    param=None,
                )
            raise ModelRefused(400, reason, "model_too_large")
        for victim in victims:
            await self._unload_if_idle(victim)

    def _least_recent_idle(self, name: str, limit: str) -> Loaded:
        idle = [m for m in self.loaded.values() if m.idle]
        if not idle:
            raise ModelRefused(
                503,
                f"cannot load {name!r}: {limit} are loaded and every one is answering "
                "requests; retry when they are done",
                "models_busy",
                retry_after=5,
                param=None,
            )
        return min(idle, key=lambda m: m.last_used)

    async def _unload_if_idle(self, loaded: Loaded) -> None:
        """Unload it unless a request took it (or it went) while the caller awaited."""
        if loaded.idle and self.loaded.get(loaded.model_id) is loaded:
            await self._unload(loaded)

    def _idle_adapters(self) -> list[tuple[Loaded, str, AdapterUse]]:
        """Every loaded adapter no request holds, least recently used first."""
        idle = [
            (m, name, use)
            for m in self.loaded.values()
            for name, use in m.adapters.items()
            if not use.leases
        ]
        return sorted(idle, key=lambda found: found[2].last_used)

    async def _unload_adapter_if_idle(self, loaded: Loaded, name: str) -> bool:
        """Unload an adapter unless a request holds it (a request naming it later loads it
        again: its engine runs the unload first)."""
        use = loaded.adapters.get(name)
        if use is None or use.leases:
            return False
        del loaded.adapters[name]
        log.info("unloading adapter %s:%s", loaded.model_id, name)
        if await asyncio.to_thread(adapter_uses.unload, loaded.thread, name):
            return True
        loaded.adapters.setdefault(name, use)
        return False

    async def _unload(self, loaded: Loaded) -> None:
        """Stop its engine thread (on a worker thread; the thread frees its engine)."""
        self.loaded.pop(loaded.model_id, None)
        log.info("unloading model %s", loaded.model_id)
        await asyncio.to_thread(loaded.thread.shutdown, 30)

    async def close(self) -> None:
        for loaded in list(self.loaded.values()):
            await self._unload(loaded)

    # -- keep-alive and memory pressure ---------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            try:
                await self.reap()
            except Exception:
                log.exception("the model pool's idle check failed")

    def stop_reaper(self) -> None:
        """The front end's event loop is ending: no more idle checks."""
        if self._reaper is not None:
            self._reaper.cancel()

    async def reap(self) -> None:
        """Unload idle models past their keep-alive; under memory pressure, shrink the idle
        ones' KV pools, then unload them least recently used first until the pressure ends."""
        keep = self.limits.keep_alive_s
        now = time.monotonic()
        for loaded, name, use in self._idle_adapters():
            if keep is not None and now - use.last_used >= keep:
                await self._unload_adapter_if_idle(loaded, name)
        for loaded in list(self.loaded.values()):
            if keep is not None and now - loaded.last_used >= keep:
                await self._unload_if_idle(loaded)
        if self.memory is None:
            return
        for loaded, name, _ in self._idle_adapters():  # the cheapest to load again go first
            if not await self._pressed():
                return
            await self._unload_adapter_if_idle(loaded, name)
        idle = sorted((m for m in self.loaded.values() if m.idle), key=lambda m: m.last_used)
        for loaded in idle:
            if not await self._pressed():
                return
            if loaded.idle:
                await asyncio.to_thread(_shrink, loaded)
        for loaded in idle:
            if not await self._pressed():
                return
            await self._unload_if_idle(loaded)

    async def _pressed(self) -> bool:
        assert self.memory is not None
        memory = await asyncio.to_thread(self.memory)
        return memory.available < memory.total * PRESSURE_FRACTION


async def _settle(
    future: asyncio.Future[Any], work: Awaitable[Any], forget: Callable[[], object]
) -> None:
    """Run a load for its waiters: its result, or what it raised, in ``future``; then
    ``forget`` it (a later request starts another)."""
    try:
        result = await work
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: a load nobody waits for any more logs nothing
    else:
        future.set_result(result)
    finally:
        forget()


def _shrink(loaded: Loaded) -> None:
    if loaded.thread.alive:
        loaded.thread.call(lambda engine: engine.shrink_pool()).result(timeout=60)
