"""``macbatch models``, ``pull`` and ``rm``: the local models, listed with whether each fits in
this machine's memory, fetched from the hub and removed (docs/models.md). Heavy imports happen
inside the commands so ``macbatch --help`` stays instant."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from macbatch.commands.columns import echo_columns

_MODELS_DIRS = typer.Option(
    None,
    "--models-dir",
    metavar="DIR",
    help="Also list the model directories under DIR (repeatable), as serve --models-dir does.",
)


def models_command(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model, in a list."),
    models_dir: list[Path] | None = _MODELS_DIRS,
    available: bool = typer.Option(
        False, "--available", help="List the short names pull, chat and ask take (no network)."
    ),
) -> None:
    """List the models that run without a download: the packaged demo model, --models-dir
    folders and the Hugging Face hub cache, with their size, tasks and whether each fits in
    this machine's memory now. `macbatch pull` downloads more (`--available`: what by short
    name)."""
    if available:
        _available(as_json)
        return
    from macbatch.engine import EngineConfig, unsupported_reason
    from macbatch.models.local import encoder_summary, local_models, tasks_of
    from macbatch.models.memory import need_of, read_memory, too_large

    memory = read_memory()
    rows = []
    for m in local_models(tuple(models_dir or ())):
        why = unsupported_reason(m.model_type)
        too_big = too_large(
            m.name, need_of(m.path, EngineConfig.kv_start_mib), memory.available, memory
        )
        rows.append(
            {
                "name": m.name,
                "path": str(m.path),
                "architecture": m.model_type,
                "quantization": m.quantization,
                "size_bytes": m.size_bytes,
                "context": m.context,
                "tasks": tasks_of(m.path),
                "encoder": encoder_summary(m.path),  # pooling, dimensions (None: not one)
                "fits_in_memory": too_big is None,
                "supported": why is None and m.problem is None,
                "problem": m.problem or (f"not supported: {why}" if why else too_big),
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no local models; `macbatch pull OWNER/NAME` downloads one")
        return
    _table(rows)


def _available(as_json: bool) -> None:
    """The shipped short-name catalogue (models/names.py), read from the package alone."""
    from macbatch.models.names import catalogue

    if as_json:
        rows = [
            {
                "name": k.name,
                "aliases": list(k.aliases),
                "family": k.family,
                "parameters_b": k.params_b,
                "quantization": k.quantization,
                "weights_bytes": k.weights_bytes,
                "repo": k.repo,
            }
            for k in catalogue()
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    lines = [("NAME", "ALSO", "FAMILY", "PARAMS", "QUANT", "MEMORY", "REPO")]
    for k in catalogue():
        memory = f"{k.weights_bytes / 2**30:,.1f} GiB"
        params = f"{k.params_b:g}B"
        lines.append(
            (k.name, ",".join(k.aliases), k.family, params, k.quantization, memory, k.repo)
        )
    echo_columns(lines)
    typer.echo("`macbatch pull NAME` downloads one; MEMORY: its weights, before the KV cache")


def presets_command() -> None:
    """List the presets (a model with a system prompt and settings, usable as -m) of
    presets.yaml in the config directory (docs/models.md, "Presets")."""
    from macbatch.models.presets import PresetError, presets_path, read_presets

    path = presets_path()
    try:
        presets = read_presets(path)
    except PresetError as error:
        typer.echo(f"macbatch presets: {error}", err=True)
        raise typer.Exit(1) from None
    if not presets:
        typer.echo(f"no presets; write them in {path} (docs/models.md, 'Presets')")
        return
    lines = [("NAME", "MODEL", "SETTINGS")]
    for p in presets.values():
        settings = ", ".join(f"{k}={v!r}" for k, v in p.values.items())
        lines.append((p.name, p.model, settings))
    echo_columns(lines)
    typer.echo(f"from {path}")


def _table(rows: list[dict]) -> None:
    lines = [("NAME", "ARCHITECTURE", "QUANTIZATION", "SIZE", "CONTEXT", "TASKS", "FITS", "")]
    for r in rows:
        lines.append(
            (
                r["name"],
                r["architecture"],
                r["quantization"],
                f"{r['size_bytes'] / 2**20:,.1f} MiB",
                f"{r['context']:,}" if r["context"] else "?",
                ",".join(r["tasks"]),
                "yes" if r["fits_in_memory"] else "no",
                r["problem"] if not r["supported"] else r["encoder"] or "",
            )
        )
    echo_columns(lines)


def _hub_id(model: str) -> str:
    """The hub id a short name or a preset means; another name as given, for the hub's own
    rule to refuse (OWNER/NAME), unless it looks like a short name (NAME:SIZE): then the
    closest short names are said."""
    from macbatch.commands.options import resolve_model
    from macbatch.models.names import UnknownModel, resolve
    from macbatch.models.presets import PresetError

    try:
        return resolve(model).model
    except UnknownModel:
        if ":" not in model:
            return model
    except PresetError:
        pass
    return resolve_model(model, param_hint="MODEL").model  # refused, saying why


def pull_command(
    model: str = typer.Argument(
        ...,
        help="A Hugging Face model id (mlx-community/Qwen3-0.6B-4bit) or a short name "
        "(qwen3:0.6b, macbatch models --available).",
    ),
    revision: str = typer.Option("main", help="Branch, tag or commit to download."),
) -> None:
    """Download a model into the Hugging Face cache, with progress; an interrupted pull resumes
    where it stopped."""
    from macbatch.models.hub import PullError, pull, usage

    model = _hub_id(model)

    try:
        folder = pull(model, revision, say=lambda line: typer.echo(line, err=True))
    except PullError as exc:
        typer.echo(f"macbatch pull: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"pulled {model} into {folder}")
    typer.echo(usage(model))


def rm_command(
    model: str = typer.Argument(..., help="A model in the Hugging Face cache (macbatch models)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
) -> None:
    """Remove a downloaded model from the Hugging Face cache."""
    from macbatch.models.hub import PullError, cached
    from macbatch.models.memory import gib

    model = _hub_id(model)

    try:
        found = cached(model)
    except PullError as exc:
        typer.echo(f"macbatch rm: {exc}", err=True)
        raise typer.Exit(1) from None
    if not yes and not typer.confirm(f"remove {model} ({gib(found.size)})?"):
        typer.echo("kept")
        raise typer.Exit(1)
    found.remove()
    typer.echo(f"removed {model}, {gib(found.size)} freed")
