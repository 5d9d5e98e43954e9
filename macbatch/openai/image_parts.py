"""``image_url`` content parts to checked images: data URLs, ``file://`` paths under the
directories the front end allows, and http(s) URLs fetched when it allows them (image_fetch.py:
public addresses only unless allowed, a size and time limit, one error for every failure).
Each failure is a 400 naming the part; a model that takes no images refuses every part before
anything is read or fetched."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from macbatch.engine import Image, ImageError, load_image
from macbatch.openai.errors import InvalidRequest
from macbatch.openai.image_fetch import FetchFailed, fetch

MAX_IMAGE_BYTES = 20 * 2**20  # as OpenAI's own limit per image
FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ImageAccess:
    """Where a front end lets a request's images come from. The default takes data URLs only:
    a front end that reads files or fetches URLs says so (serve: its flags, docs/serve.md;
    run: the user's own job files, docs/jobs.md)."""

    refused: str | None = None  # why the model takes no images: every image part refused at once
    remote: bool = False  # fetch http(s) URLs
    private: bool = False  # ... to loopback, private and link-local addresses too
    local_dirs: tuple[Path, ...] | None = ()  # file:// under these (resolved); None: any path
    timeout_s: float = FETCH_TIMEOUT_S  # one fetch in all: DNS, redirects, reading


DATA_ONLY = ImageAccess()


def image_part(part: dict[str, Any], where: str, access: ImageAccess = DATA_ONLY) -> Image:
    """The image of one ``{"type": "image_url", "image_url": {"url": ...}}`` part (the url may
    also be given as a plain string, as some clients send it)."""
    if access.refused is not None:
        raise InvalidRequest(f"{where}: the model takes no images: {access.refused}", where)
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{where}: an image_url part needs image_url.url (a string)", where)
    try:
        return load_image(_image_bytes(url, where, access), where)
    except ImageError as exc:
        raise InvalidRequest(str(exc), where) from exc


def _image_bytes(url: str, where: str, access: ImageAccess) -> bytes:
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        return _data_url(url, where)
    if scheme == "file":
        return _local_file(Path(unquote(urlparse(url).path)), where, access)
    if scheme in ("http", "https"):
        if not access.remote:
            raise InvalidRequest(
                f"{where}: this server does not fetch image URLs; send the image as a "
                "data:image/...;base64 URL",
                where,
            )
        return _fetch(url, where, access)
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


def _local_file(path: Path, where: str, access: ImageAccess) -> bytes:
    """The file, when it lies under an allowed directory (symbolic links resolved first); the
    refusal reads the same whether or not the path exists."""
    if access.local_dirs is not None:
        resolved = path.resolve()
        if not any(resolved.is_relative_to(d.resolve()) for d in access.local_dirs):
            raise InvalidRequest(
                f"{where}: file:// images are read only under the directories this server "
                "allows (--allow-local-images); send the image as a data:image/...;base64 URL",
                where,
            )
        path = resolved
    if not path.is_file():
        raise InvalidRequest(f"{where}: no image file at {path}", where)
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"{where}: {path} is over {MAX_IMAGE_BYTES >> 20} MiB", where)
    return path.read_bytes()


def _fetch(url: str, where: str, access: ImageAccess) -> bytes:
    try:
        return fetch(
            url, private=access.private, timeout_s=access.timeout_s, max_bytes=MAX_IMAGE_BYTES
        )
    except FetchFailed:
        raise InvalidRequest(f"{where}: could not fetch the image at {url[:200]}", where) from None
