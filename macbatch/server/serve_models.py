"""``macbatch serve``'s models: what it may serve (each ``--model``, then every local model), how
one loads (an engine thread per model, taking turns on the device), and the ``--model``s loaded
before the server starts, each checked against the memory first (docs/models.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from macbatch import cli_options
from macbatch.memory import read_memory
from macbatch.server.device import Turns, load_on_device
from macbatch.server.errors import APIError
from macbatch.server.pool import ModelPool, PoolLimits, Servable

if TYPE_CHECKING:
    from macbatch.engine import EngineConfig, EngineThread
    from macbatch.openai import ImageAccess
    from macbatch.server.command import ServeSettings


def engine_config(settings: ServeSettings) -> EngineConfig:
    """Every model's engine settings (each model sizes its own pool from them)."""
    from macbatch.engine import EngineConfig

    return EngineConfig(
        max_num_seqs=settings.max_num_seqs,
        num_blocks=settings.kv_blocks,
        kv_bits=settings.kv_bits,
        reranker=settings.reranker or None,  # None: recognised by its name
        speculative=settings.speculative,
        draft_model=settings.draft_model,
        num_speculative_tokens=settings.num_speculative_tokens,
        **cli_options.disk_cache_config(
            settings.cache_dir, settings.cache_disk_gb, settings.no_disk_cache
        ),
    )


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


def model_pool(settings: ServeSettings, config: EngineConfig, images: ImageAccess) -> ModelPool:
    """The pool with the ``--model``s loaded (as many as ``--max-loaded-models`` allows); a
    model that does not fit or fails to load ends the command with the reason."""
    entries = catalog(settings.model, tuple(Path(d) for d in settings.models_dir))
    limits = PoolLimits(
        keep_alive_s=None if settings.keep_alive < 0 else settings.keep_alive,
        max_loaded=settings.max_loaded_models,
        max_waiting=max(1, settings.max_queue),
        kv_start_mib=config.kv_start_mib,
    )
    pool = ModelPool(entries, starter(config, Turns()), images, limits, read_memory)
    most = settings.max_loaded_models or len(settings.model)
    for entry in entries[: min(most, len(settings.model))]:
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
