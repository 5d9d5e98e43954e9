"""Parsing a body off the event loop when it may carry images: reading an image part decodes it
(and may fetch it, for up to the fetch time limit), which must not stall the loop that streams
every other reply. Such bodies are parsed on a bounded pool of their own, not the default one
where every request is templated and tokenized: eight hanging image URLs once made a plain text
request wait 8.5 s there. Text-only bodies are parsed in place (no thread hop on the common
path)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

IMAGE_PARSE_WORKERS = 8  # bodies with images parsed at once; more wait for a free worker
_IMAGE_PARSES = ThreadPoolExecutor(IMAGE_PARSE_WORKERS, thread_name_prefix="image-parse")


async def parse_body_off_loop(body: Any, parse: Callable[[], T]) -> T:
    """``parse()`` (which reads ``body``), on the image pool when the body has content parts."""
    if _has_parts(body):
        return await asyncio.get_running_loop().run_in_executor(_IMAGE_PARSES, parse)
    return parse()


def _has_parts(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    turns = body.get("messages", body.get("input"))
    return isinstance(turns, list) and any(
        isinstance(turn, dict) and isinstance(turn.get("content"), list) for turn in turns
    )
