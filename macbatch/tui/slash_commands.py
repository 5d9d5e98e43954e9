"""The commands typed in the message box (`/model NAME`, `/image PATH` ...): one table that the
chat screen runs them from, F1 lists and `/help` shows, so a command is named in one place.

A line whose first word looks like a command (a slash, then a letter and letters, digits or
dashes) is never sent to the model: a mistyped `/hepl` used to go to it as a message. A path
(`/usr/bin/env is ...`) has a second slash in its first word, so it is text.
"""

from __future__ import annotations

import re
from typing import NamedTuple

COMMAND_WORD = re.compile(r"/[A-Za-z][\w-]*")


class SlashCommand(NamedTuple):
    """A command as F1 and `/help` show it: its names, its argument, what it does."""

    names: tuple[str, ...]
    argument: str
    action: str

    @property
    def usage(self) -> str:
        return ", ".join(" ".join(filter(None, (name, self.argument))) for name in self.names)


COMMANDS = (
    SlashCommand(("/image", "/attach"), "PATH", "Attach an image to the next message (like F3)"),
    SlashCommand(("/detach",), "", "Drop the attached images"),
    SlashCommand(("/model",), "NAME", "Run this chat on another local model (alone: F4's list)"),
    SlashCommand(("/help",), "", "List these commands (F1 lists every key)"),
)


def command_word(text: str) -> tuple[str, str] | None:
    """``(name, argument)`` when ``text`` is a command, known or not (None: a message)."""
    name, _, argument = text.strip().partition(" ")
    return (name, argument.strip()) if COMMAND_WORD.fullmatch(name) else None


def find(name: str) -> SlashCommand | None:
    """The command called ``name`` (None: no such command)."""
    return next((command for command in COMMANDS if name in command.names), None)


def commands_text() -> str:
    """What `/help` (and an unknown command) shows: every command on its line."""
    return "\n".join(f"{command.usage}: {command.action}" for command in COMMANDS)
