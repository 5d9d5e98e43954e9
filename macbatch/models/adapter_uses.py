"""The fine-tunes loaded into a pool's engines (docs/models.md, "Fine-tunes"): which requests
hold each, when each was last used, and the engine calls that load and unload one between
steps. The pool (``models/pool.py``) decides when: on first use, and least recently used first
under its keep-alive and memory guard, as it does for models."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.models.memory import Need

if TYPE_CHECKING:
    from macbatch.engine import EngineThread

LOAD_TIMEOUT_S = 600.0  # reading an adapter's weights and restacking every adapted layer


@dataclass
class AdapterUse:
    """One adapter loaded into one engine."""

    nbytes: int  # its weights, as loaded
    leases: int = 0  # requests naming it that have not ended
    last_used: float = field(default_factory=time.monotonic)


def need_of_adapter(path: str) -> Need:
    """What loading the adapter in ``path`` takes: its weights as stored (no KV of its own)."""
    return Need(sum(p.stat().st_size for p in Path(path).glob("*.safetensors")), 0)


def uses_of(thread: EngineThread) -> dict[str, AdapterUse]:
    """The adapters an engine holds as it started (loaded with it)."""
    return {name: AdapterUse(ref.nbytes) for name, ref in thread.info.model.adapters.items()}


def load(thread: EngineThread, name: str, path: str) -> AdapterUse:
    """On a worker thread: load the adapter into the engine, between its steps."""
    ref = thread.call(lambda engine: engine.load_adapter(name, path)).result(LOAD_TIMEOUT_S)
    return AdapterUse(ref.nbytes)


def unload(thread: EngineThread, name: str) -> bool:
    """On a worker thread: unload it (False: a request in the engine still names it)."""
    if not thread.alive:
        return False
    return bool(thread.call(lambda engine: engine.unload_adapter(name)).result(60))
