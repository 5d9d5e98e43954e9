"""A one-line input that applies every key in the order typed.

Textual inserts a printable key as soon as the focused widget reads it, but runs a key's
*binding* (Backspace, Delete, the arrows, Enter) only after the key has bubbled up to the app.
Keys typed faster than the app handles them then overtook each other: Backspace Backspace
Backspace 3, typed fast over "2.5" in the settings, gave "2" instead of "3". So this input runs
the binding of each non-printable key itself before it reads the next key, as the message box
does (`message_box.py`).
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class OrderedInput(Input):
    """`Input`, each key applied before the next is read."""

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable:
            await super()._on_key(event)
        elif await self.app._check_bindings(event.key):  # as the app would, once it bubbled up
            event.stop()
            event.prevent_default()
