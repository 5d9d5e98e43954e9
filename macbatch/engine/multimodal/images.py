"""Images a prompt carries: their bytes, checked once where they enter (a clear error naming the
part), and the content hash that keys the encode cache and the prefix cache's block hashes."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from typing import Any

from macbatch import VISION_EXTRA

# A 100-megapixel photo decodes to 300 MB of RGB before any resizing; the families served here
# resize to at most a few megapixels, so larger images are refused rather than decoded.
MAX_PIXELS = 50_000_000


class ImageError(ValueError):
    """An image that cannot be used; the message names the part and what to do."""


@dataclass(frozen=True)
class Image:
    """A decoded-once, checked image: ``data`` is the file's bytes, ``digest`` their sha256."""

    data: bytes = field(repr=False)
    digest: str
    width: int
    height: int

    def pil(self) -> Any:
        """The image as an RGB ``PIL.Image`` (decoded again: Images stay cheap to keep)."""
        pil_image = _pil()
        with pil_image.open(io.BytesIO(self.data)) as opened:
            return opened.convert("RGB")


def _pil() -> Any:
    try:
        from PIL import Image as pil_image
    except ImportError as exc:
        raise ImageError(f"images need Pillow and mlx-vlm: {VISION_EXTRA}") from exc
    return pil_image


def load_image(data: bytes, where: str) -> Image:
    """``data`` checked as an image: it decodes fully (a truncated file fails here, not in the
    engine) and has at most ``MAX_PIXELS`` pixels."""
    pil_image = _pil()
    pil_image.MAX_IMAGE_PIXELS = None  # the cap below is ours, with our message
    try:
        with pil_image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
            if width * height > MAX_PIXELS:
                raise ImageError(
                    f"{where}: the image is {width}x{height} ({width * height / 1e6:.0f} "
                    f"megapixels); at most {MAX_PIXELS / 1e6:.0f} megapixels are accepted: "
                    "resize it first"
                )
            opened.load()  # decodes every byte: truncated data raises here
    except ImageError:
        raise
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError ...
        raise ImageError(f"{where}: not a readable image ({exc})") from exc
    return Image(data, hashlib.sha256(data).hexdigest(), width, height)


def images_of(messages: Any) -> tuple[Image, ...]:
    """The images of chat messages, in order (parts ``{"type": "image", "image": Image}``)."""
    if isinstance(messages, str) or not isinstance(messages, (list, tuple)):
        return ()
    found = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found += [p["image"] for p in content if isinstance(p.get("image"), Image)]
    return tuple(found)
