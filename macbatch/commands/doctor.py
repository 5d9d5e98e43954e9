"""`macbatch doctor [MODEL]`: what macbatch sees on this machine (device, attention path, CPU
kernel, default KV pool, BLAS, data directory) and, with MODEL, whether it can be served."""

from __future__ import annotations

import contextlib
import platform
import sys

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import LOAD_ONLY, EngineKnobs

DOCTOR_KNOBS = Pick(EngineKnobs, LOAD_ONLY)


@takes(knobs=DOCTOR_KNOBS)
def doctor_command(
    model: str = typer.Argument(None, help="A local model (path, cached hub id, demo) to check."),
    adapter: list[str] | None = typer.Option(  # noqa: B008 (typer's way)
        None,
        "--adapter",
        metavar="PATH",
        help="A LoRA / DoRA adapter directory (mlx-lm's or PEFT's) to describe: its format, "
        "rank, targets and bytes (repeatable; docs/models.md, 'Fine-tunes').",
    ),
    *,
    knobs: EngineKnobs,
) -> None:
    """Print what macbatch sees: platform, MLX device, attention path, data directory, models;
    with MODEL, whether it can be served and how (its weights loaded for the self-check,
    unless --no-self-check)."""
    from importlib.metadata import version

    import mlx.core as mx

    from macbatch import __version__
    from macbatch.config import data_dir
    from macbatch.demo import MODEL_DIR
    from macbatch.metal import attention_backend, cpu_kernel_status, ensure_selftest

    ensure_selftest()  # report the path an engine would take (builds the CPU kernel if needed)
    rows = [
        ("macbatch", __version__),
        ("python", platform.python_version()),
        ("platform", f"{platform.system()} {platform.machine()}"),
        ("mlx", version("mlx")),
        ("device", str(mx.default_device())),
        ("metal", "available" if mx.metal.is_available() else "not available"),
        ("attention", attention_backend()),
        ("cpu kernel", cpu_kernel_status()),
        ("kv cache (demo)", _demo_kv_pool()),
        ("data dir", str(data_dir())),
        ("demo model", str(MODEL_DIR) if (MODEL_DIR / "config.json").exists() else "missing"),
    ]
    if sys.platform == "linux":
        rows.append(("cpu blas", _blas()))
    report = None
    if model is not None:
        from macbatch.models.check import check_model
        from macbatch.models.names import resolve

        with contextlib.suppress(ValueError):  # a name that means nothing: the check says why
            model = resolve(model).model
        report = check_model(model, self_check=not knobs.no_self_check)
        rows += [("model", model), *report.rows]
        rows.append(("servable", "yes" if report.servable else f"no: {report.problem}"))
    bad_adapter = False
    for path in adapter or ():
        described = _adapter_rows(path)
        bad_adapter |= described[-1][0] == "adapter error"
        rows += described
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")
    if bad_adapter or (report is not None and not report.servable):
        raise typer.Exit(1)


def _adapter_rows(path: str) -> list[tuple[str, str]]:
    """What an adapter's files say of it (its weights read, no model loaded)."""
    from macbatch.engine import AdapterError, read_adapter

    try:
        files = read_adapter(path)
    except AdapterError as exc:
        return [("adapter", path), ("adapter error", str(exc))]
    return [
        ("adapter", path),
        ("  format", f"{files.format} {files.kind}, rank {files.rank}, scale {files.scale:g}"),
        ("  targets", f"{', '.join(files.targets)} ({len(files.layers)} layers)"),
        ("  bytes", f"{files.nbytes:,}"),
    ]


def _demo_kv_pool() -> str:
    """The KV pool an engine sizes by default, shown for the demo model (loads in a second)."""
    from macbatch.engine import Engine

    try:
        engine = Engine.load("demo")
    except ValueError as exc:
        return f"cannot load the demo model: {exc}"
    stats, config = engine.stats(), engine.config
    tokens = stats.kv_blocks_total * config.block_size
    cap_mib = stats.kv_blocks_cap * engine.runner.store.bytes_per_block / 2**20
    grows = (
        f"grows to {stats.kv_blocks_cap:,} blocks, {cap_mib:,.1f} MiB"
        if stats.kv_blocks_cap > stats.kv_blocks_total
        else "its cap"
    )
    return (
        f"{stats.kv_blocks_total:,} blocks of {config.block_size} tokens = {tokens:,} tokens, "
        f"{stats.kv_cache_bytes / 2**20:,.1f} MiB, {stats.kv_bytes_used / 2**20:,.1f} MiB used "
        f"({grows}: {config.max_num_seqs} sequences x {engine.info.max_model_len:,}-token "
        f"context, at most {config.memory_fraction:.0%} of memory)"
    )


def _blas() -> str:
    """The BLAS this process runs on: the OpenBLAS it was started with (cli.main preloads the
    one macbatch.blas chooses), else the reference BLAS and what would make it fast."""
    from macbatch.blas import choose, preloaded

    found = preloaded()
    if found is not None:
        return f"OpenBLAS preloaded ({found})"
    chosen = choose()
    if chosen.path is None:
        return chosen.description
    return f"MLX's reference BLAS (slow): {chosen.description} is there but not preloaded"
