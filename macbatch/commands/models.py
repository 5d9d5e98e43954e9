"""``macbatch models``, ``pull`` and ``rm``: the local models, listed with whether each fits in
this machine's memory, fetched from the hub and removed (docs/models.md). Heavy imports happen
inside the commands so ``macbatch --help`` stays instant."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_MODELS_DIRS = typer.Option(
    None,
    "--models-dir",
    metavar="DIR",
    help="Also list the model directories under DIR (repeatable), as serve --models-dir does.",
)


def models_command(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model, in a list."),
    models_dir: list[Path] | None = _MODELS_DIRS,
) -> None:
    """List the models that run without a download: the packaged demo model, --models-dir
    folders and the Hugging Face hub cache, with their size, tasks and whether each fits in
    this machine's memory now. `macbatch pull` downloads more."""
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
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def pull_command(
    model: str = typer.Argument(
        ..., help="A Hugging Face model id, e.g. mlx-community/Qwen3-0.6B-4bit."
    ),
    revision: str = typer.Option("main", help="Branch, tag or commit to download."),
) -> None:
    """Download a model into the Hugging Face cache, with progress; an interrupted pull resumes
    where it stopped."""
    from macbatch.models.hub import PullError, pull, usage

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
