"""What an empty chat shows: how to start, and for the demo model what it can answer.

The demo model only answers five kinds of questions; without this a new user types "hello",
gets nonsense and concludes the app is broken.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Static

from macbatch.demo import MODEL_DIR
from macbatch.demo.tasks import SHOWCASE

GENERAL_HINT = "Type a message below and press Enter. F1 lists the keys."


def is_demo_model(model: str) -> bool:
    """Whether `model` (a CLI name or a path) is the bundled demo model."""
    return model == "demo" or Path(model).expanduser().resolve() == MODEL_DIR


def welcome_text(model: str) -> str:
    """The text of an empty chat with `model`."""
    if not is_demo_model(model):
        return GENERAL_HINT
    lines = [
        "This is the bundled demo model: a tiny model that answers five kinds of questions",
        "(and nothing else). Try one:",
        "",
    ]
    lines += [f"  {question:<42} {what}" for what, question in SHOWCASE.values()]
    lines += ["", GENERAL_HINT]
    return "\n".join(lines)


class EmptyChat(Static):
    """Shown in a transcript while it has no messages."""

    def __init__(self, model: str) -> None:
        super().__init__(welcome_text(model), markup=False)
