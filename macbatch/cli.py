"""The `macbatch` command line: parse, call, print. Each command lives with its
front end; heavy imports happen inside the commands so `macbatch --help` is instant."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import typer

from macbatch.batch.command import run_command
from macbatch.config import DEFAULT_MODEL
from macbatch.launch import follower_exit_status
from macbatch.server.command import serve_command
from macbatch.tui.command import chat_command

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")

app = typer.Typer(
    name="macbatch",
    help="Local LLMs on your Mac: several chats at once (chat), batch jobs of thousands of "
    "prompts (run) and an OpenAI-compatible API (serve), all on one MLX engine with continuous "
    "batching and a paged KV cache. Try: macbatch run jobs/demo.yaml",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _follow_rank_zero() -> None:
    # Under mlx.launch every rank runs the same command line: rank 0 runs the command, the
    # others serve its engine's steps and exit when it stops (docs/distributed.md).
    status = follower_exit_status()
    if status is not None:
        raise typer.Exit(status)


app.command("chat")(chat_command)
app.command("run")(run_command)
app.command("serve")(serve_command)


@app.command("doctor")
def doctor_command() -> None:
    """Print what macbatch sees: platform, MLX device, attention path, data directory, models."""
    import mlx.core as mx

    import macbatch
    from macbatch.config import data_dir
    from macbatch.demo import MODEL_DIR
    from macbatch.metal import attention_backend, ensure_selftest

    ensure_selftest()  # report the path an engine would take (builds the CPU kernel if needed)
    rows = [
        ("macbatch", macbatch.__version__),
        ("python", platform.python_version()),
        ("platform", f"{platform.system()} {platform.machine()}"),
        ("mlx", mx.__version__),
        ("device", str(mx.default_device())),
        ("metal", "available" if mx.metal.is_available() else "not available"),
        ("attention", attention_backend()),
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
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@app.command("models")
def models_command() -> None:
    """List the models that run without a download: the packaged demo model and the Hugging Face
    hub cache. Any other hub id is downloaded on first use."""
    from macbatch.engine.adapter import unsupported_reason
    from macbatch.models import local_models

    models = local_models()
    if not models:
        typer.echo("no local models; `macbatch run`, `chat` and `serve` download hub ids on use")
        return
    width = max(len(m.name) for m in models)
    for m in models:
        why = unsupported_reason(m.model_type)
        note = f"  (not supported: {why})" if why else ""
        typer.echo(f"{m.name:<{width}}  {m.model_type:<14} {m.size_bytes / 2**20:9,.1f} MiB{note}")


@app.command("bench")
def bench_command(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Model name, path or hub id."),
    requests: int = typer.Option(32, min=1, help="Requests, all arriving at once."),
    min_prompt: int = typer.Option(32, min=1, help="Shortest prompt, in tokens."),
    max_prompt: int = typer.Option(512, min=1, help="Longest prompt, in tokens."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens generated per request (EOS ignored)."),
    budget: int = typer.Option(1024, min=1, help="Tokens per engine step (chunked prefill)."),
) -> None:
    """Measure this model on this machine: random-token prompts through the engine, then total
    and generated tokens/s and the median time to first token."""
    from macbatch.bench import run_workload, synthetic_prompts
    from macbatch.engine import Engine, EngineConfig

    if min_prompt > max_prompt:
        raise typer.BadParameter("--min-prompt must not exceed --max-prompt")
    typer.echo(f"loading {model} ...")
    try:
        engine = Engine.load(model, EngineConfig(max_num_batched_tokens=budget))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    prompts = synthetic_prompts(requests, min_prompt, max_prompt, engine.vocab_size)
    typer.echo(f"{requests} requests, {sum(map(len, prompts)):,} prompt tokens, {max_tokens} new")
    result = run_workload(engine, prompts, max_tokens)
    typer.echo(
        f"{result.elapsed[0]:.1f} s: {result.total_tokens_per_s():,.1f} total tok/s, "
        f"{result.generated_tokens_per_s():,.1f} generated tok/s, median time to first token "
        f"{result.median_ttft() * 1000:,.0f} ms, {len(result.step_tokens)} engine steps"
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
    app()
