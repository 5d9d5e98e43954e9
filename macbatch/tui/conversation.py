"""A session's history as the engine sees it (chat messages), as a user exports it (Markdown),
and the title its first message gives it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from macbatch.session_settings import SAMPLING_FIELDS
from macbatch.tui.store import ERROR, Message, Session
from macbatch.tui.widgets.display import pictured_controls

TITLE_CHARS = 40  # the sidebar shows about 24 and ends the rest with "…"; the chat's border more


def prompt_messages(session: Session, history: list[Message]) -> list[dict[str, Any]]:
    """Chat messages in the OpenAI shape: the system prompt, then every turn with text (a user
    turn with images: its ``image_url`` parts, then its text, as serve would receive it).

    Failed replies carry no model text, so they are left out; stopped and interrupted replies
    keep the part the user saw.
    """
    messages = []
    if session.settings.system_prompt.strip():
        messages.append({"role": "system", "content": session.settings.system_prompt})
    for message in history:
        if message.status == ERROR and not message.content:
            continue
        content: Any = message.content
        if message.images:
            text = [{"type": "text", "text": message.content}] if message.content else []
            content = [image.part() for image in message.images] + text
        messages.append({"role": message.role, "content": content})
    return messages


def to_markdown(
    session: Session,
    history: list[Message],
    images: Mapping[int, Sequence[Path]] | None = None,
    model: str = "",
    exported: float | None = None,
) -> str:
    """The chat as a Markdown document: a title, the model, when it started and was exported,
    the settings, then one section per message (with links to its images, ``images[message
    id]``: paths relative to the document). Control characters a model or a paste put in the
    text are written as their visible pictures, as the app shows them: a raw escape would drive
    the terminal that `cat`s the file."""
    settings = session.settings
    lines = [f"# {pictured_controls(session.title)}", ""]
    if model:
        lines.append(f"- model: {model}")
    lines.append(f"- started: {_when(session.created)}")
    lines.append(f"- exported: {_when(time.time() if exported is None else exported)}")
    for field in SAMPLING_FIELDS:
        lines.append(f"- {field.label.lower()}: {field.text(getattr(settings, field.name))}")
    if settings.thinking is not None:
        lines.append(f"- thinking: {'on' if settings.thinking else 'off'}")
    if settings.system_prompt:
        lines += ["", "## System", "", pictured_controls(settings.system_prompt)]
    for message in history:
        heading = "User" if message.role == "user" else "Assistant"
        if message.status not in ("done", "streaming"):
            heading += f" ({message.status})"
        lines += ["", f"## {heading}", ""]
        for path in (images or {}).get(message.id, ()):
            lines += [f"![{path.name}]({path.as_posix()})", ""]
        lines.append(pictured_controls(message.content))
        if message.error:
            lines += ["", f"> error: {pictured_controls(message.error)}"]
    return "\n".join(lines) + "\n"


def _when(timestamp: float) -> str:
    """A time as the reader's local date and time, with its offset from UTC."""
    return datetime.fromtimestamp(timestamp).astimezone().strftime("%Y-%m-%d %H:%M %z")


def title_from(text: str) -> str:
    """A chat's automatic title: its first message on one line, cut at a word near
    `TITLE_CHARS` characters."""
    line = " ".join(text.split())
    if len(line) <= TITLE_CHARS:
        return line
    cut = line[: TITLE_CHARS - 1]
    space = cut.rfind(" ")
    if line[len(cut)].isalnum() and space >= TITLE_CHARS // 2:  # do not end mid-word
        cut = cut[:space]
    return cut.rstrip() + "…"
