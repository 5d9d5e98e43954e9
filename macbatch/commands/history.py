"""``macbatch history QUERY``: find text in every conversation kept in the chat history (ask's
and chat's, docs/chat.md), newest first, with the chat it is in (open it in ``macbatch chat``,
continue ask's last with ``ask -c``)."""

from __future__ import annotations

import json

import typer

SNIPPET_CHARS = 100


def history_command(
    query: str = typer.Argument(..., help="Text to find, in any case."),
    limit: int = typer.Option(20, "--limit", min=1, help="Most messages shown."),
    as_json: bool = typer.Option(False, "--json", help="One JSON list of the messages found."),
) -> None:
    """Search the conversations of ask and chat (the chat history) for QUERY."""
    from macbatch.commands.ask_history import search
    from macbatch.tui.history_file import HistoryError, history_path

    try:
        found = search(history_path(), query, limit)
    except HistoryError as error:
        typer.echo(f"macbatch history: {error}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        rows = [{"chat": chat, "title": title, "text": text} for chat, title, text in found]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not found:
        typer.echo(f"nothing in the history holds {query!r}")
        return
    for chat, title, text in found:
        snippet = " ".join(text.split())
        snippet = snippet if len(snippet) <= SNIPPET_CHARS else snippet[: SNIPPET_CHARS - 1] + "…"
        typer.echo(f"chat {chat} ({title}): {snippet}")
