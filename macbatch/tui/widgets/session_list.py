"""The sidebar: every session, newest last; moving the highlight opens that session."""

from __future__ import annotations

from textual.widgets import ListView

from macbatch.tui.widgets.session_item import SessionItem


class SessionList(ListView):
    """Sessions by id; arrow keys or a click highlight one, and the screen opens it."""

    BORDER_TITLE = "Chats"

    @property
    def items(self) -> list[SessionItem]:
        return list(self.query_children(SessionItem))

    def item_for(self, session_id: int) -> SessionItem:
        for item in self.items:
            if item.session_id == session_id:
                return item
        raise KeyError(session_id)

    def highlight(self, session_id: int) -> None:
        """Move the highlight without posting `Highlighted`: that message means the user moved
        it, and arriving late (after a second switch) it would reopen the chat left behind."""
        with self.prevent(ListView.Highlighted):
            self.index = self.items.index(self.item_for(session_id))
