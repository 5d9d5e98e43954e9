"""`macbatch chat`: the typer command (registered by macbatch/cli.py) and `python -m` entry.

Heavy imports (mlx, Textual, the engine) happen inside the function so `macbatch --help` is fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import (
    DISK_CACHE,
    SPECULATIVE,
    EngineKnobs,
    disk_cache_line,
    resolve_model,
)
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.tui.store import HistoryStore

# chat's engine knobs: the pool's size and page format, speculation and the disk tier
CHAT_KNOBS = Pick(
    EngineKnobs,
    ("kv_blocks", "kv_bits", "indexer_keys", *SPECULATIVE, *DISK_CACHE, "no_self_check"),
)


@takes(knobs=CHAT_KNOBS)
def chat_command(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            show_default=False,
            help="Model to chat with: 'demo' (bundled, works offline), a short name such as "
            "qwen3:0.6b (macbatch models --available), a preset (macbatch presets), a local MLX "
            "model directory, or a Hugging Face hub id. "
            f"Given, a chat on it opens; else the chat used last [default: {DEFAULT_MODEL}].",
        ),
    ] = None,
    system: Annotated[
        str | None,
        typer.Option(
            help="System prompt for new chats (each chat can change it: ctrl+s).",
            show_default=False,
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="Sampling temperature for new chats (0 = greedy; 0.7).", show_default=False
        ),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option(help="Nucleus sampling top_p for new chats (1.0).", show_default=False),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(help="Longest reply, in tokens, for new chats (512).", show_default=False),
    ] = None,
    *,
    knobs: EngineKnobs,
    history: Annotated[
        Path | None,
        typer.Option(
            help="Chat history database (default: chat.sqlite3 in the data directory, which "
            "MACBATCH_HOME overrides)."
        ),
    ] = None,
    export_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where ctrl+o writes chats as Markdown (default: exports/ in the data directory)."
        ),
    ] = None,
    models_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--models-dir",
            metavar="DIR",
            help="Also offer the model directories under DIR to chats (F4, /model; repeatable).",
        ),
    ] = None,
) -> None:
    """Chat with a local model in several sessions at once; every session streams in parallel.

    Keys: ctrl+n new chat, ctrl+pageup/pagedown switch, Esc stop, ctrl+r regenerate, ctrl+g edit
    the last message, ctrl+s settings, ctrl+o export, F4 this chat's model, PageUp/PageDown
    scroll, F1 for all keys.
    History is kept in the data directory (MACBATCH_HOME overrides it); see docs/chat.md.
    """
    named = model is not None  # a chat on it opens, whichever chat was used last
    resolved = resolve_model(model or DEFAULT_MODEL)
    model = resolved.model
    from macbatch.config import data_dir
    from macbatch.engine import EngineConfig, EngineThread
    from macbatch.models.presets import layered
    from macbatch.session_settings import SessionSettings
    from macbatch.tui.history_file import HistoryBusy, HistoryError, HistoryLock, history_path

    try:
        given = {"system_prompt": system, "temperature": temperature, "top_p": top_p}
        defaults = layered(SessionSettings(), resolved.preset, given | {"max_tokens": max_tokens})
        fields = knobs.engine_fields((model,))
        config = EngineConfig(**fields)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    typer.echo(disk_cache_line(fields), err=True)
    home = data_dir()
    path = history or history_path()
    try:
        lock = HistoryLock(path)
        store = open_history(path)
    except HistoryBusy as busy:
        typer.echo(
            f"error: {busy}. The history itself is sound: wait until that process is done "
            "with it (or end it), then start macbatch chat again.",
            err=True,
        )
        raise typer.Exit(1) from None
    except HistoryError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    # the terminal is blank until the app draws (imports, the engine thread): say what comes
    typer.echo(f"Starting macbatch chat with {start_model(store, model, named)}…", err=True)
    if (problem := terminal_problem()) is not None:
        store.close()
        lock.release()
        typer.echo(f"macbatch chat: {problem}", err=True)
        raise typer.Exit(2)
    from macbatch.tui.app import ChatApp
    from macbatch.tui.loading import LoadProgress, make_loader

    progress = LoadProgress()
    engine = EngineThread(make_loader(model, config, progress))
    app = ChatApp(
        engine,
        store,
        model_label=model,
        export_dir=export_dir or home / "exports",
        defaults=defaults,
        load_progress=progress,
        engine_config=config,
        models_dirs=tuple(d.expanduser().resolve() for d in models_dir or ()),
        start_on_model=named,
    )
    size_from_the_terminal()
    try:
        app.run()
    finally:
        lock.release()
    if app.unwritten:
        typer.echo(f"error: {app.unwritten}", err=True)
    if app.return_code or app.unwritten:  # Textual printed a crash and returned: not success
        raise typer.Exit(app.return_code or 1)


def start_model(store: HistoryStore, model: str, named: bool) -> str:
    """The model of the chat the app opens: ``-m MODEL``'s when given (a chat on it), else the
    chat reopened's (its own, when it picked one)."""
    reopened = None if named else store.reopened()
    return (reopened.model if reopened else None) or model


def open_history(path: Path) -> HistoryStore:
    """The history at ``path``; if it is damaged, say so, keep it, and offer a fresh one
    (the damaged file moved aside under a timestamped name). Declined: ``HistoryError``."""
    from macbatch.tui.history_file import CorruptHistory, aside_name, set_aside
    from macbatch.tui.store import HistoryStore

    try:
        return HistoryStore(path)
    except CorruptHistory as error:
        typer.echo(
            f"The chat history {path} is damaged: {error.problem}. It is kept as it is.", err=True
        )
        question = f"Move it aside (to {aside_name(path).name}) and start a fresh history?"
        try:
            fresh = typer.confirm(question, default=False, err=True)
        except typer.Abort:  # no answer (end of input, Ctrl-C): as declined
            fresh = False
        if not fresh:
            raise
        moved = set_aside(path)
        typer.echo(f"Moved the damaged history to {moved}; starting a fresh one.", err=True)
        return HistoryStore(path)


def terminal_problem() -> str | None:
    """Why chat cannot run here (None: it can). Without a terminal on both ends the app has no
    keys to read and draws into a pipe for ever (`macbatch chat </dev/null | tail` spun at 90%
    CPU), so it is refused, after every option and the history are checked."""
    streams = {"input": sys.stdin, "output": sys.stdout}
    missing = [name for name, stream in streams.items() if stream is None or not stream.isatty()]
    if not missing:
        return None
    return (
        f"needs a terminal, and there is none on its {' and '.join(missing)}: for a question "
        'from a script or a pipe use macbatch ask "..." (or macbatch serve for an API)'
    )


def size_from_the_terminal() -> None:
    """Make the app draw at the terminal's size, and follow it when it changes.

    Textual takes its size from `shutil.get_terminal_size`, which believes COLUMNS and LINES over
    the terminal. Exported (by a shell profile, a parent process, a tmux server started from
    another terminal) they are stale: the app drew 160x48 into a 120x36 pane and ignored resizes.
    Nothing else in this process reads them.
    """
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


def main() -> None:
    """`python -m macbatch.tui.command`: the same command without the macbatch CLI around it."""
    typer.run(chat_command)


if __name__ == "__main__":
    main()
