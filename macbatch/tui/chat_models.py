"""The models chats run on: serve's model pool (``models/pool.py``) in the chat app.

Chat starts on one model (``--model``, its engine thread handed in); a chat may switch to any
model macbatch finds locally (``/model NAME`` or F4), which then loads on demand while every
chat stays usable, each load's progress kept here for the loading panel. All engines take turns
of the one device, as serve's do, so two chats on two models stream at the same time. A model
stays loaded while the app runs, unless the memory guard needs its room for another (least
recently used first) or memory runs short (docs/chat.md, "A model per chat"). A chat's model may
be a fine-tune, ``BASE:ADAPTER`` (an adapter under a ``--models-dir``): it runs in its base
model's engine, beside the base and the base's other adapters, loaded when a chat first picks it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.engine import EngineConfig, EngineThread, Turns
from macbatch.models.adapter_uses import need_of_adapter
from macbatch.models.catalog import catalog, starter
from macbatch.models.memory import MIB, Need, need_of, read_memory, weights_bytes
from macbatch.models.pool import Loaded, ModelPool, ModelRefused, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.tui.loading import LoadProgress, make_loader

if TYPE_CHECKING:
    from collections.abc import Callable

    from macbatch.engine import Engine


# what frees another model's memory in chat (memory.too_large): idle models already went
UNLOAD = "stop the replies of chats on other models, so their models can unload"
# why a chat's model is not in this run's catalog (serve's 404 text speaks of GET /v1/models)
NOT_HERE = (
    "it is not available in this run of chat (a model under a --models-dir this run was not "
    "given, or one removed since): pick another with F4 or /model NAME"
)


@dataclass
class ModelLoad:
    """One model's load as the loading panel shows it: progress, start, and why it failed."""

    progress: LoadProgress = field(default_factory=LoadProgress)
    started: float = field(default_factory=time.monotonic)
    error: str | None = None


class ChatModels:
    """The pool of chat's models, the first (``first``, not started) among them."""

    def __init__(
        self,
        first: EngineThread,
        name: str,
        config: EngineConfig,
        progress: LoadProgress,
        models_dirs: tuple[Path, ...] = (),
        folders: tuple[str, ...] = (),
    ) -> None:
        """``folders``: the model folders the history's chats run on (a path given to ``-m``
        in an earlier run), served too, after ``name``."""
        self.turns = Turns()
        self.first = first.share_device(self.turns)
        self.first_name = name
        self.config = config
        self.loads: dict[str, ModelLoad] = {name: ModelLoad(progress)}
        start = starter(config, self.turns, self._loader_of)
        limits = PoolLimits(keep_alive_s=None, kv_start_mib=config.kv_start_mib, unload=UNLOAD)
        given = (name, *(f for f in folders if f != name))
        self.pool = ModelPool(catalog(given, models_dirs), start, DATA_ONLY, limits, read_memory)
        self._tasks: set[asyncio.Task[None]] = set()
        self._first_settled = False  # the app's load of the first model ended (either way)

    def _loader_of(self, entry: Servable) -> Callable[[], Engine]:
        progress = self.loads.setdefault(entry.name, ModelLoad()).progress  # an adapter's base
        return make_loader(entry.source, self.config, progress)

    # -- names -------------------------------------------------------------------------------

    def name_of(self, requested: str) -> str:
        """The catalog's name for ``requested`` (a name, a folder's name, a path given to
        ``--model``; ``BASE:ADAPTER`` or ``ADAPTER`` for a fine-tune, named ``BASE:ADAPTER``);
        ``ModelRefused`` with what to do when no local model has it."""
        try:
            base = self.pool.name_of(requested)
        except ModelRefused:
            raise ModelRefused(
                404,
                f"no local model is called {requested!r}: F4 lists them (`macbatch models` "
                "too; `macbatch pull OWNER/NAME` downloads one)",
                "model_not_found",
            ) from None
        adapter = self.pool.adapter_of(requested)
        return base if adapter is None else f"{base}:{adapter}"

    def adapter_of(self, name: str) -> str | None:
        """The fine-tune a chat's model names (None: a base model)."""
        return self.pool.adapter_of(name)

    def _base(self, name: str) -> str:
        """The model whose engine runs ``name`` (a name no longer served: itself)."""
        try:
            return self.pool.name_of(name)
        except ModelRefused:
            return name

    def names(self) -> list[str]:
        """Every model, each followed by its fine-tunes."""
        return [
            name
            for base, entry in self.pool.catalog.items()
            for name in (base, *(f"{base}:{a}" for a in entry.adapter_paths))
        ]

    def label(self, name: str) -> str:
        """How a model is shown: a local folder by its name (a fine-tune: its base's, then
        ``:ADAPTER``)."""
        adapter, base = self.adapter_of(name), self._base(name)
        shown = Path(base).name if Path(base).is_dir() else base
        return shown if adapter is None else f"{shown}:{adapter}"

    # -- loading -----------------------------------------------------------------------------

    def first_loaded(self) -> None:
        """The first model's thread is ready (the app loaded it): the pool serves it now."""
        entry = self.pool.catalog[self.first_name]
        need = need_of(entry.path, self.config.kv_start_mib) if entry.path else Need(0, 0)
        self.pool.add_loaded(self.pool.loaded_model(self.first, self.first_name, need))
        self._first_settled = True

    def first_failed(self, reason: str) -> None:
        self.loads[self.first_name].error = reason
        self._first_settled = True

    def present(self, name: str) -> Loaded | None:
        """The model's engine while it (and the fine-tune ``name`` names) is loaded, running or
        stopped since."""
        loaded = self.pool.loaded.get(self._base(name))
        adapter = self.adapter_of(name)
        if loaded is None or (adapter is not None and adapter not in loaded.adapters):
            return None
        return loaded

    def loaded(self, name: str) -> Loaded | None:
        """The model's engine, if it is loaded and running."""
        loaded = self.present(name)
        return loaded if loaded is not None and loaded.thread.alive else None

    def loading(self, name: str) -> bool:
        return self.loaded(name) is None and self.loads.get(name, ModelLoad()).error is None

    def ensure_loading(self, name: str) -> None:
        """Start loading ``name`` on the app's event loop unless it is loaded, loading, failed
        to load, or the first model while the app loads it itself."""
        first_pending = name == self.first_name and not self._first_settled
        if self.loaded(name) is not None or first_pending:
            return
        load = self.loads.get(name)
        if load is not None and (load.error is not None or name in self._pending()):
            return  # a failed load is tried again when a chat picks the model again
        self.loads[name] = ModelLoad()
        task = asyncio.ensure_future(self._load(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def try_again(self, name: str) -> None:
        """A chat picked ``name`` again: a load that failed is forgotten, to be tried anew."""
        load = self.loads.get(name)
        if load is not None and load.error is not None:
            del self.loads[name]
        self.ensure_loading(name)

    def _pending(self) -> set[str]:
        return {t.get_name() for t in self._tasks if not t.done()}

    async def _load(self, name: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            task.set_name(name)
        try:
            loaded = await self.pool.lease(name)
        except ModelRefused as refused:
            self.loads[name].error = NOT_HERE if refused.status == 404 else refused.message
        else:
            self.pool.give_back(loaded, self.adapter_of(name))

    async def hold(self, name: str) -> Loaded:
        """The loaded model (and fine-tune), held (never unloaded) until ``release``: a
        reply's."""
        return await self.pool.lease(name)

    def release(self, loaded: Loaded, name: str) -> None:
        self.pool.give_back(loaded, self.adapter_of(name))

    def describe(self, name: str) -> str:
        """A model's line in the picker: loaded (and its memory), loading, failed, or its size
        on disk."""
        loaded = self.present(name)
        load = self.loads.get(name)
        adapter = self.adapter_of(name)
        if loaded is not None:
            memory = self._memory(loaded) if adapter is None else loaded.adapters[adapter].nbytes
            return f"loaded, {memory / MIB:,.0f} MiB"
        if load is not None and load.error is not None:
            return f"failed: {load.error}"
        if load is not None and name in self._pending():
            return "loading"
        entry = self.pool.catalog[self._base(name)]
        if adapter is not None:
            size = need_of_adapter(entry.adapter_paths[adapter]).total
            return f"fine-tune of {self.label(entry.name)}, {size / MIB:,.0f} MiB on disk"
        path = entry.path
        return "not loaded" if path is None else f"{weights_bytes(path) / MIB:,.0f} MiB on disk"

    @staticmethod
    def _memory(loaded: Loaded) -> int:
        """What a loaded model uses now: its weights and its KV pool."""
        stats = loaded.thread.stats()
        return loaded.need.weights + (stats.kv_cache_bytes if stats is not None else 0)

    # -- what the status bar shows -----------------------------------------------------------

    def memory_text(self) -> str:
        """Each loaded model and the memory it uses now: its weights and its KV pool."""
        parts = [
            f"{self.label(name)} {self._memory(loaded) / MIB:,.0f} MiB"
            for name, loaded in self.pool.loaded.items()
        ]
        return "loaded: " + (", ".join(parts) or "none")

    def close(self) -> None:
        """Stop every engine (the app is ending): each thread frees its own."""
        for task in self._tasks:
            task.cancel()
        self.pool.stop_reaper()
        threads = {loaded.thread for loaded in self.pool.loaded.values()} | {self.first}
        for thread in threads:
            thread.shutdown()
