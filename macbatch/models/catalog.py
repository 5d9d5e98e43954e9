"""What a pool may load and how one loads: the models named on the command line, then every local
model (the Hugging Face cache, ``--models-dir`` folders), each started as its own engine thread
taking turns of the one device (docs/models.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.models.pool import Servable, Starter

if TYPE_CHECKING:
    from macbatch.engine import EncoderEngine, Engine, EngineConfig, Turns


def catalog(
    given: tuple[str, ...],
    models_dirs: tuple[Path, ...],
    adapters: tuple[tuple[str, str], ...] = (),
) -> list[Servable]:
    """The ``given`` models in their order (by the name given, and their folder's name), then
    every local model not among them; ``adapters`` are the first given model's."""
    from macbatch.engine import resolve_model_path
    from macbatch.models.local import local_models

    local = local_models(models_dirs)
    paths = {m.name: m.path for m in local}
    entries = []
    for name in given:
        try:
            where = resolve_model_path(name)
        except ValueError:
            where = name  # the load says why
        path = where if isinstance(where, Path) else paths.get(name)
        entries.append(Servable(name, name, path, (Path(name).name,), adapters))
        adapters = ()
    names = {alias for e in entries for alias in (e.name, *e.aliases)}
    folders = {e.path.resolve() for e in entries if e.path is not None}
    for model in local:
        if model.name not in names and model.path.resolve() not in folders:
            entries.append(Servable(model.name, str(model.path), model.path))
    return with_found_adapters(entries, models_dirs)


def with_found_adapters(entries: list[Servable], models_dirs: tuple[Path, ...]) -> list[Servable]:
    """``entries`` with the adapter folders under ``models_dirs`` (an ``adapter_config.json``,
    named by their folder) each given to the model its config names (by that model's name, its
    folder's name or its path; the first such entry): loaded on first use. An adapter whose base
    is served under no name is left out, as is one named like an adapter given already."""
    from macbatch.engine import base_model_of

    found: dict[str, dict[str, str]] = {}
    for directory in models_dirs:
        folder = directory.expanduser()
        for path in sorted(folder.iterdir()) if folder.is_dir() else ():
            base = base_model_of(path) if (path / "adapter_config.json").is_file() else None
            entry = None if base is None else _base_entry(entries, base)
            if entry is not None and path.name not in dict(entry.adapters):
                found.setdefault(entry.name, {}).setdefault(path.name, str(path))
    return [replace(e, found=tuple(found.get(e.name, {}).items())) for e in entries]


def _base_entry(entries: list[Servable], base: str) -> Servable | None:
    where = Path(base).expanduser()
    folder = where.resolve() if where.exists() else None
    for entry in entries:
        names = (entry.name, *entry.aliases)
        by_name = base in names or where.name in {Path(n).name for n in names}
        if by_name or (
            folder is not None and entry.path is not None and entry.path.resolve() == folder
        ):
            return entry
    return None


# the function an engine thread runs to build a servable model's engine
LoaderOf = Callable[[Servable], Callable[[], "Engine | EncoderEngine"]]


def starter(config: EngineConfig, turns: Turns, loader_of: LoaderOf | None = None) -> Starter:
    """Starts a model's engine thread, its load and steps in turns of the device (``loader_of``:
    how its engine is built, ``Engine.load`` of its source by default; chat's reports the
    download's progress)."""
    from macbatch.engine import EngineThread, load_engine

    def default_loader(entry: Servable) -> Callable[[], Engine | EncoderEngine]:
        return lambda: load_engine(entry.source, replace(config, adapters=entry.adapters))

    build = loader_of or default_loader

    def start(entry: Servable) -> EngineThread:
        name = f"macbatch-engine-{entry.name}"
        return EngineThread(build(entry), name=name, device=turns).start()

    return start
