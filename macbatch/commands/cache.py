"""``macbatch cache``: what the disk KV cache holds per model, and clearing it (docs/engine.md,
"The disk tier"). No MLX: it reads the cache directory's files."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from macbatch.commands.columns import echo_columns
from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import EngineKnobs, disk_cache_config

cache_app = typer.Typer(
    help="List the KV blocks kept on disk per model (size, blocks, last use), or clear them.",
    invoke_without_command=True,
    no_args_is_help=False,
)


CACHE_DIR = Pick(EngineKnobs, ("cache_dir",))  # the directory the engine's disk tier uses


def _root(knobs: EngineKnobs) -> Path:
    return Path(disk_cache_config(knobs.cache_dir, None, False)["disk_cache_dir"])


@cache_app.callback()
@takes(knobs=CACHE_DIR)
def cache_list(
    ctx: typer.Context,
    *,
    knobs: EngineKnobs,
) -> None:
    """List what the disk KV cache holds, per model and page format."""
    if ctx.invoked_subcommand is not None:
        return
    from macbatch.engine import cap_rule, default_cap_bytes, stored_models
    from macbatch.models.names import expected_weights_bytes

    root = _root(knobs)
    models = stored_models(root)
    _say_not_caches(root)
    if not models:
        typer.echo(f"nothing cached on disk in {root}")
    else:
        rows = [("MODEL", "FORMAT", "BLOCK", "BLOCKS", "SIZE", "LAST USE", "CAP")]
        for m in models:
            used = time.localtime(m.last_use) if m.last_use else None
            cap = default_cap_bytes(root, expected_weights_bytes(m.model))
            cells = (m.model, m.page_format, str(m.block_size), f"{m.blocks:,}", _mib(m.bytes))
            rows.append((*cells, time.strftime("%Y-%m-%d %H:%M", used) if used else "-", _mib(cap)))
        echo_columns(rows)
        typer.echo(f"{_mib(sum(m.bytes for m in models))} in {root}")
    typer.echo(f"default cap (serve, run and chat say theirs at start): {cap_rule(root)}")
    typer.echo("--cache-disk-gb sets it" + ("; CAP: that model's alone" if models else ""))


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


@cache_app.command("clear")
@takes(knobs=CACHE_DIR)
def cache_clear(
    model: str = typer.Argument(None, help="Only this model's blocks (default: every model's)."),
    *,
    knobs: EngineKnobs,
) -> None:
    """Delete the KV blocks kept on disk (all of them, or one model's)."""
    from macbatch.engine import clear_stored

    root = _root(knobs)
    deleted = clear_stored(root, model)
    if not deleted and model is not None:
        typer.echo(f"no blocks of {model!r} in {root}", err=True)
        raise typer.Exit(1)
    freed = sum(m.bytes for m in deleted)
    typer.echo(f"cleared {len(deleted)} cache(s), {freed / 2**20:,.1f} MiB, in {root}")
    _say_not_caches(root)


def _say_not_caches(root: Path) -> None:
    """Name what in ``root`` is not a cache (on stderr: it is never counted nor deleted)."""
    from macbatch.engine import not_caches

    for path in not_caches(root):
        typer.echo(f"not a cache (left alone): {path}", err=True)
