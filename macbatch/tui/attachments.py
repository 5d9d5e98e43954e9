"""Images attached to chat messages: read and checked from a path, shown as a chip, kept in the
history as bytes, sent as OpenAI ``image_url`` parts, exported as files beside the Markdown.

The history keeps each image's bytes (an ``attachments`` table in the same SQLite file), not its
path: the file the user attached from (a download, a screenshot in /tmp) may be moved or deleted,
and a chat must still show, resend and export its picture. One file also stays one thing to back
up or move. Images are small next to what a chat's store could hold (the request layer caps one
at 20 MiB).
"""

from __future__ import annotations

import base64
import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macbatch.engine import ImageError, load_image
from macbatch.openai.image_parts import MAX_IMAGE_BYTES


class AttachmentError(ValueError):
    """A path that cannot be attached; the text says what and how to fix it."""


@dataclass(frozen=True)
class Attachment:
    """One image of a message: its file name, bytes and pixel size."""

    name: str
    data: bytes = field(repr=False)
    width: int
    height: int

    def chip(self) -> str:
        """What the chip above the input and the transcript show: name, file size, pixels."""
        return f"🖼 {self.name} · {file_size(len(self.data))} · {self.width}×{self.height}"

    def data_url(self) -> str:
        mime = mimetypes.guess_type(self.name)[0] or "application/octet-stream"
        return f"data:{mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def part(self) -> dict[str, Any]:
        """The OpenAI content part serve would receive for this image."""
        return {"type": "image_url", "image_url": {"url": self.data_url()}}


def read_attachment(path_text: str) -> Attachment:
    """The image at ``path_text`` (``~`` expanded), checked as the request layer checks one:
    it decodes fully and is not too big."""
    path = Path(path_text.strip().strip("'\"")).expanduser()
    if not path_text.strip():
        raise AttachmentError("Attach what? Give an image's path: /image PATH")
    if not path.is_file():
        raise AttachmentError(f"No such file: {path}")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise AttachmentError(
            f"{path.name} is {file_size(size)}; images of at most "
            f"{file_size(MAX_IMAGE_BYTES)} can be attached: resize it first"
        )
    data = path.read_bytes()
    try:
        image = load_image(data, path.name)
    except ImageError as error:
        raise AttachmentError(str(error)) from error
    return Attachment(path.name, data, image.width, image.height)


def file_size(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    if count < 1024**2:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 1024**2:.1f} MiB"


def export_images(folder: Path, message_id: int, images: list[Attachment]) -> list[Path]:
    """Write a message's images into ``folder`` (names prefixed by the message id, so two
    messages' ``photo.png`` do not collide); their paths."""
    paths = []
    for i, image in enumerate(images):
        path = folder / f"{message_id}-{i}-{Path(image.name).name}"
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image.data)
        paths.append(path)
    return paths
