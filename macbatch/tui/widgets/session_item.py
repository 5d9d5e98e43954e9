"""A row of the session list: the session's title, marked while it is generating."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Label, ListItem


class SessionItem(ListItem):
    """One session in the sidebar; `generating` adds a marker and the `-generating` class."""

    generating: reactive[bool] = reactive(False)

    def __init__(self, session_id: int, title: str) -> None:
        self.session_id = session_id
        self.title = title
        super().__init__(Label(f"  {title}", markup=False))

    def _label(self) -> str:
        return f"● {self.title}" if self.generating else f"  {self.title}"

    def set_title(self, title: str) -> None:
        self.title = title
        self.query_one(Label).update(self._label())

    def watch_generating(self, generating: bool) -> None:
        self.set_class(generating, "-generating")
        if self.is_mounted:
            self.query_one(Label).update(self._label())
