"""The `macbatch` command line: registers each command (its module in `commands/` or with its
front end: `batch/`, `server/`, `tui/`) and starts. Heavy imports happen inside the commands so
`macbatch --help` is instant."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.core

from macbatch.batch.command import run_command
from macbatch.blas import choose as choose_blas
from macbatch.blas import preloaded
from macbatch.commands.ask import ask_command
from macbatch.commands.bench import bench_command
from macbatch.commands.cache import cache_app
from macbatch.commands.doctor import doctor_command
from macbatch.commands.history import history_command
from macbatch.commands.launch import LaunchError, follower_exit_status
from macbatch.commands.models import models_command, presets_command, pull_command, rm_command
from macbatch.commands.ps import ps_command
from macbatch.server.command import serve_command
from macbatch.tui.command import chat_command

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
app.command("presets")(presets_command)
app.command("ps")(ps_command)
app.command("history")(history_command)
app.command("doctor")(doctor_command)
app.command("bench")(bench_command)
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
    try:
        status = follower_exit_status()
    except LaunchError as error:
        typer.echo(f"macbatch: {error}", err=True)
        raise typer.Exit(2) from None
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
            # "[x>=1]" beside each number would leave an 80-column help's descriptions no
            # room; an out-of-range value is refused with the range all the same
            param._get_number_range_help_str = lambda: ""
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


# The re-executed interpreter's program: `python -m macbatch` would put the current directory
# first on the import path, so a folder holding a `macbatch/` directory (the one above a clone)
# would shadow the package; `-c` puts it there too, as '', and the program drops it first.
REEXEC = (
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "from macbatch.cli import command\n"
    "command()(prog_name='macbatch')\n"
)


def main() -> None:
    """Console entry point. On Linux, re-executes once with OpenBLAS preloaded (macbatch.blas
    says which: the system's, else the cmeel-openblas wheel's): MLX's CPU wheel links a
    reference BLAS about 12x slower for float32 matmuls."""
    if sys.platform == "linux" and not preloaded() and not os.environ.get("MACBATCH_NO_REEXEC"):
        chosen = choose_blas().path
        if chosen is not None:
            env = dict(os.environ, MACBATCH_NO_REEXEC="1")
            env["LD_PRELOAD"] = ":".join(p for p in (str(chosen), env.get("LD_PRELOAD")) if p)
            os.execve(sys.executable, [sys.executable, "-c", REEXEC, *sys.argv[1:]], env)
    command()(prog_name="macbatch")
