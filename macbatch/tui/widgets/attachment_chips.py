"""The images attached to the next message, one chip each (name, file size, pixels), shown above
the message box until the message is sent; hidden while there are none."""

from __future__ import annotations

from textual.widgets import Static

from macbatch.tui.attachments import Attachment


class AttachmentChips(Static):
    def __init__(self) -> None:
        super().__init__(id="attachments", markup=False)
        self.attached: list[Attachment] = []
        self.display = False

    def add(self, image: Attachment) -> None:
        self.attached.append(image)
        self._show()

    def take(self) -> tuple[Attachment, ...]:
        """The attached images, which the chips then forget (the message took them)."""
        taken = tuple(self.attached)
        self.clear()
        return taken

    def clear(self) -> None:
        self.attached = []
        self._show()

    def _show(self) -> None:
        self.display = bool(self.attached)
        chips = "  ".join(f"[{image.chip()}]" for image in self.attached)
        self.update(f"{chips}  (/detach removes them)" if chips else "")
