"""``macbatch serve``'s models: the pool over each ``--model`` then every local model
(``models/pool.py``), with the ``--model``s loaded before the server starts, each checked against
the memory first (docs/models.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from macbatch.models.catalog import catalog, starter
from macbatch.models.memory import read_memory
from macbatch.models.pool import ModelPool, ModelRefused, PoolLimits, Servable

if TYPE_CHECKING:
    from macbatch.engine import EngineConfig
    from macbatch.openai import ImageAccess


def model_pool(
    given: tuple[str, ...],
    models_dirs: tuple[Path, ...],
    limits: PoolLimits,
    config: EngineConfig,
    images: ImageAccess,
    adapters: tuple[tuple[str, str], ...] = (),
) -> ModelPool:
    """The pool with the ``given`` models loaded (as many as ``limits.max_loaded`` allows); a
    model that does not fit or fails to load ends the command with the reason."""
    from macbatch.engine import Turns

    entries = catalog(given, models_dirs, adapters)
    pool = ModelPool(entries, starter(config, Turns()), images, limits, read_memory)
    for entry in entries[: min(limits.max_loaded or len(given), len(given))]:
        _load_now(pool, entry)
    return pool


def _load_now(pool: ModelPool, entry: Servable) -> None:
    typer.echo(f"macbatch serve: loading {entry.name} ...", err=True)
    try:
        loaded = pool.load_now(entry.name)
    except ModelRefused as exc:
        typer.echo(f"macbatch serve: {exc.message}", err=True)
        raise typer.Exit(1) from None
    dtype = loaded.thread.call(lambda engine: engine.compute_dtype).result()
    typer.echo(f"macbatch serve: weights in {dtype.dtype}: {dtype.reason}", err=True)
