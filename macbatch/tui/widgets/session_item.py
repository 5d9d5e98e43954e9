"""A row of the session list: the session's title, marked while it is generating."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Label, ListItem

from macbatch.tui.widgets.display import displayable


class SessionItem(ListItem):
    """One session in the sidebar; `generating` adds a marker and the `-generating` class."""

    generating: reactive[bool] = reactive(False)

    def __init__(self, session_id: int, title: str) -> None:
        self.session_id = session_id
        self.title = title
        self.label = Label(f"  {displayable(title)}", markup=False)
        super().__init__(self.label)

    def _text(self) -> str:
        title = displayable(self.title)
        return f"● {title}" if self.generating else f"  {title}"

    def set_title(self, title: str) -> None:
        self.title = title
        self.label.update(self._text())

    def watch_generating(self, generating: bool) -> None:
        self.set_class(generating, "-generating")
        self.label.update(self._text())
