"""``image_url`` content parts to checked images: data URLs, local ``file://`` paths, and
http(s) URLs fetched with a size and time limit. Each failure is a 400 naming the part."""

from __future__ import annotations

import base64
import binascii
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from macbatch.engine import Image, ImageError, load_image
from macbatch.openai.errors import InvalidRequest

MAX_IMAGE_BYTES = 20 * 2**20  # as OpenAI's own limit per image
FETCH_TIMEOUT_S = 10.0


def image_part(part: dict[str, Any], where: str) -> Image:
    """The image of one ``{"type": "image_url", "image_url": {"url": ...}}`` part (the url may
    also be given as a plain string, as some clients send it)."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{where}: an image_url part needs image_url.url (a string)", where)
    try:
        return load_image(_image_bytes(url, where), where)
    except ImageError as exc:
        raise InvalidRequest(str(exc), where) from exc


def _image_bytes(url: str, where: str) -> bytes:
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        return _data_url(url, where)
    if scheme == "file":
        return _local_file(Path(unquote(urlparse(url).path)), where)
    if scheme in ("http", "https"):
        return _fetch(url, where)
    raise InvalidRequest(
        f"{where}: image_url.url must be a data: URL, a file:// path or an http(s) URL; got "
        f"{url[:40]!r}",
        where,
    )


def _data_url(url: str, where: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise InvalidRequest(
            f"{where}: a data URL must be data:image/...;base64,<data>; got {url[:40]!r}", where
        )
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InvalidRequest(f"{where}: the image is over {MAX_IMAGE_BYTES >> 20} MiB", where)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{where}: the data URL is not valid base64 ({exc})", where) from exc


def _local_file(path: Path, where: str) -> bytes:
    if not path.is_file():
        raise InvalidRequest(f"{where}: no image file at {path}", where)
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"{where}: {path} is over {MAX_IMAGE_BYTES >> 20} MiB", where)
    return path.read_bytes()


def _fetch(url: str, where: str) -> bytes:
    """At most ``MAX_IMAGE_BYTES`` of ``url``, all within ``FETCH_TIMEOUT_S`` (a server that
    sends a byte now and then is cut off too, not only one that never answers)."""
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    chunks: list[bytes] = []
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
            while chunk := response.read(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_IMAGE_BYTES:
                    raise InvalidRequest(
                        f"{where}: {url[:80]} is over {MAX_IMAGE_BYTES >> 20} MiB", where
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not received within {FETCH_TIMEOUT_S:g} s")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise InvalidRequest(f"{where}: could not fetch {url[:80]} ({exc})", where) from exc
    return b"".join(chunks)
