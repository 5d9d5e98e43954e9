"""The `macbatch` command line: parse, call the front end, print. Each command lives with its
front end; heavy imports happen inside the commands so `macbatch --help` is instant."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import typer

from macbatch.batch.command import run_command
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
    from macbatch.metal import attention_backend

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
