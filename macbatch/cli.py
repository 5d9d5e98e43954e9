"""The `macbatch` command line: parse, call, print. Each command lives with its
front end; heavy imports happen inside the commands so `macbatch --help` is instant."""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import typer.core

from macbatch.ask import ask_command
from macbatch.batch.command import run_command
from macbatch.cache_command import cache_app
from macbatch.cli_options import (
    draft_model_option,
    num_speculative_tokens_option,
    speculative_config,
    speculative_option,
)
from macbatch.config import DEFAULT_MODEL
from macbatch.launch import follower_exit_status
from macbatch.model_commands import models_command, pull_command, rm_command
from macbatch.server.command import serve_command
from macbatch.tui.command import chat_command

if TYPE_CHECKING:
    from macbatch.bench import WorkloadResult

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")

HELP_OPTIONS = ["-h", "--help"]

app = typer.Typer(
    name="macbatch",
    help="Local LLMs on your Mac: several chats at once (chat), batch jobs of thousands of "
    "prompts (run) and an OpenAI-compatible API (serve), all on one MLX engine with continuous "
    "batching and a paged KV cache. Try it on the bundled demo model, offline: macbatch chat, "
    'or macbatch ask "What is 48 + 37?"',
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # docstrings' line breaks are reflowed, `code` is shown as such
    context_settings={"help_option_names": HELP_OPTIONS},
)


app.command("chat")(chat_command)
app.command("ask")(ask_command)
app.command("run")(run_command)
app.command("serve")(serve_command)
app.command("models")(models_command)
app.command("pull")(pull_command)
app.command("rm")(rm_command)
app.add_typer(cache_app, name="cache")


def _show_version(value: bool) -> None:
    if value:
        import macbatch

        typer.echo(f"macbatch {macbatch.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        callback=_show_version,
        is_eager=True,
        help="Print macbatch's version and exit.",
    ),
) -> None:
    """Options for every command; under mlx.launch, every rank but 0 becomes a follower here:
    every rank runs the same command line, rank 0 runs the command and the others serve its
    engine's steps and exit when it stops (docs/distributed.md)."""
    status = follower_exit_status()
    if status is not None:
        raise typer.Exit(status)
    _quiet_library_logs()


def _quiet_library_logs() -> None:
    """transformers warns when it tokenizes more than the model's context; every front end
    measures a prompt against the context itself and refuses it with a clearer error, so the
    warning would only repeat that in serve's log and over run's progress."""
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)


def command() -> Callable[..., Any]:
    """The click command behind ``app``, with help that names values the way click does
    (FILE, INTEGER, PATH) rather than typer's ``<bool>`` / ``<list[str]>`` type labels."""
    group = typer.main.get_command(app)
    for sub in [group, *getattr(group, "commands", {}).values()]:
        sub.context_settings.setdefault("help_option_names", HELP_OPTIONS)
        help_option = sub.get_help_option(typer.Context(sub, **sub.context_settings))  # cached
        for param in [*sub.params, *([help_option] if help_option else [])]:
            if param.metavar is not None:
                continue
            if isinstance(param, typer.core.TyperArgument):
                name = (param.name or "value").upper()
                name = name if param.required else f"[{name}]"
                param.metavar = name
                # typer writes a required argument as {name} in the usage line; click's FILE
                # is what users and man pages know.
                # typer's renderer calls these methods; replacing them per parameter is the
                # documented way to change its display, which mypy cannot see
                param._usage_display_name = lambda name=name: name  # type: ignore[method-assign,misc]
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            elif getattr(param, "is_flag", False):
                param.metavar = ""
            else:
                bare = param.bare_type().removeprefix("list[").removesuffix("]")
                param.metavar = _METAVARS.get(bare, "VALUE")
    return group


_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "Path": "PATH"}


@app.command("doctor")
def doctor_command(
    model: str = typer.Argument(None, help="A local model (path, cached hub id, demo) to check."),
) -> None:
    """Print what macbatch sees: platform, MLX device, attention path, data directory, models;
    with MODEL, whether it can be served and how (without loading its weights)."""
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
        preloaded = "openblas" in os.environ.get("LD_PRELOAD", "")
        blas = (
            "OpenBLAS preloaded"
            if preloaded
            else (
                "reference BLAS (slow): apt-get install libopenblas0-pthread"
                if not OPENBLAS.exists()
                else "OpenBLAS present but not preloaded"
            )
        )
        rows.append(("cpu blas", blas))
    report = None
    if model is not None:
        from macbatch.model_check import check_model

        report = check_model(model)
        rows += [("model", model), *report.rows]
        rows.append(("servable", "yes" if report.servable else f"no: {report.problem}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")
    if report is not None and not report.servable:
        raise typer.Exit(1)


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


@app.command("bench")
def bench_command(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Model name, path or hub id."),
    requests: int = typer.Option(32, min=1, help="Requests, all arriving at once."),
    min_prompt: int = typer.Option(32, min=1, help="Shortest prompt, in tokens."),
    max_prompt: int = typer.Option(512, min=1, help="Longest prompt, in tokens."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens generated per request (EOS ignored)."),
    budget: int = typer.Option(1024, min=1, help="Tokens per engine step (chunked prefill)."),
    embed: bool = typer.Option(
        False, "--embed", help="Embed the prompts (pooling requests) instead of generating."
    ),
    speculative: str = speculative_option(),
    draft_model: str | None = draft_model_option(),
    num_speculative_tokens: int | None = num_speculative_tokens_option(),
) -> None:
    """Measure this model on this machine: random-token prompts through the engine, then total
    and generated tokens/s and the median time to first token (`--embed`: embedding
    throughput, prompt tokens/s and inputs/s)."""
    from macbatch.bench import run_pooling_workload, run_workload, synthetic_prompts
    from macbatch.engine import Engine, EngineConfig

    if min_prompt > max_prompt:
        raise typer.BadParameter("--min-prompt must not exceed --max-prompt")
    spec = speculative_config(speculative, draft_model, num_speculative_tokens)
    typer.echo(f"loading {model} ...")
    try:
        engine = Engine.load(model, EngineConfig(max_num_batched_tokens=budget, **spec))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    prompts = synthetic_prompts(requests, min_prompt, max_prompt, engine.info.model.vocab_size)
    if embed:
        typer.echo(f"{requests} inputs to embed, {sum(map(len, prompts)):,} tokens")
        result, _ = run_pooling_workload(engine, prompts)
    else:
        typer.echo(
            f"{requests} requests, {sum(map(len, prompts)):,} prompt tokens, {max_tokens} new"
        )
        result = run_workload(engine, prompts, max_tokens)
    if result.failures:
        typer.echo(
            f"{len(result.failures)} of {requests} requests failed; first: {result.failures[0]}",
            err=True,
        )
    if not result.succeeded:
        typer.echo("error: no request succeeded, so there is nothing to measure", err=True)
        raise typer.Exit(1)
    typer.echo(_rates(result, embed))
    counts = engine.stats().speculation
    if counts.verifications:
        typer.echo(
            f"speculative: {counts.acceptance_rate:.0%} of {counts.drafted:,} drafted tokens "
            f"accepted, {counts.mean_accepted_length:.2f} tokens per verification"
        )


def _rates(result: WorkloadResult, embed: bool) -> str:
    """What ``bench`` measured, in one line."""
    wall, steps = result.elapsed[0], len(result.step_tokens)
    if embed:
        return (
            f"{wall:.1f} s: {result.prompt_tokens / wall:,.1f} tok/s embedded, "
            f"{result.succeeded / wall:,.1f} inputs/s, {steps} engine steps"
        )
    return (
        f"{wall:.1f} s: {result.total_tokens_per_s():,.1f} total tok/s, "
        f"{result.generated_tokens_per_s():,.1f} generated tok/s, median time to first token "
        f"{result.median_ttft() * 1000:,.0f} ms, {steps} engine steps"
    )


def main() -> None:
    """Console entry point. On Linux, re-executes once with OpenBLAS preloaded when the machine
    has it: MLX's CPU wheel links a reference BLAS about 40x slower for float32 matmuls."""
    if (
        sys.platform == "linux"
        and OPENBLAS.exists()
        and "openblas" not in os.environ.get("LD_PRELOAD", "")
        and not os.environ.get("MACBATCH_NO_REEXEC")
    ):
        env = dict(os.environ, MACBATCH_NO_REEXEC="1")
        env["LD_PRELOAD"] = ":".join(p for p in (str(OPENBLAS), env.get("LD_PRELOAD")) if p)
        os.execve(sys.executable, [sys.executable, "-m", "macbatch", *sys.argv[1:]], env)
    command()(prog_name="macbatch")
