"""``macbatch serve``'s models: what it may serve (each ``--model``, then every local model), how
one loads (an engine thread per model, taking turns on the device), and the ``--model``s loaded
before the server starts, each checked against the memory first (docs/models.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from macbatch.memory import read_memory
from macbatch.server.device import Turns, load_on_device
from macbatch.server.errors import APIError
from macbatch.server.pool import ModelPool, PoolLimits, Servable

if TYPE_CHECKING:
    from macbatch.engine import EngineConfig, EngineThread
    from macbatch.openai import ImageAccess


def catalog(given: tuple[str, ...], models_dirs: tuple[Path, ...]) -> list[Servable]:
    """The ``--model``s in their order (by the name given, and their folder's name), then every
    local model not among them."""
    from macbatch.engine import resolve_model_path
    from macbatch.models import local_models

    local = local_models(models_dirs)
    paths = {m.name: m.path for m in local}
    entries = []
    for name in given:
        try:
            where = resolve_model_path(name)
        except ValueError:
            where = name  # the load says why
        path = where if isinstance(where, Path) else paths.get(name)
        entries.append(Servable(name, name, path, (Path(name).name,)))
    names = {alias for e in entries for alias in (e.name, *e.aliases)}
    folders = {e.path.resolve() for e in entries if e.path is not None}
    for model in local:
        if model.name not in names and model.path.resolve() not in folders:
            entries.append(Servable(model.name, str(model.path), model.path))
    return entries


def starter(
    config: EngineConfig, turns: Turns
) -> Callable[[Servable], tuple[EngineThread, Callable[[], None]]]:
    """Starts a model's engine thread, its load and steps in turns of the device; the release it
    returns frees the engine and hands MLX's cached buffers back to the system."""
    from macbatch.engine import Engine, EngineThread

    def start(entry: Servable) -> tuple[EngineThread, Callable[[], None]]:
        load, release = load_on_device(lambda: Engine.load(entry.source, config), turns, entry.name)
        thread = EngineThread(load, name=f"macbatch-engine-{entry.name}").start()

        def free() -> None:
            import mlx.core as mx

            release()
            with turns.turn("unload"):
                mx.clear_cache()

        return thread, free

    return start


def model_pool(
    given: tuple[str, ...],
    models_dirs: tuple[Path, ...],
    limits: PoolLimits,
    config: EngineConfig,
    images: ImageAccess,
) -> ModelPool:
    """The pool with the ``given`` models loaded (as many as ``limits.max_loaded`` allows); a
    model that does not fit or fails to load ends the command with the reason."""
    entries = catalog(given, models_dirs)
    pool = ModelPool(entries, starter(config, Turns()), images, limits, read_memory)
    for entry in entries[: min(limits.max_loaded or len(given), len(given))]:
        _load_now(pool, entry)
    return pool


def _load_now(pool: ModelPool, entry: Servable) -> None:
    typer.echo(f"macbatch serve: loading {entry.name} ...", err=True)
    try:
        loaded = pool.load_now(entry.name)
    except APIError as exc:
        typer.echo(f"macbatch serve: {exc.message}", err=True)
        raise typer.Exit(1) from None
    dtype = loaded.thread.call(lambda engine: engine.compute_dtype).result()
    typer.echo(f"macbatch serve: weights in {dtype.dtype}: {dtype.reason}", err=True)
