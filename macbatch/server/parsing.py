"""Parsing a body off the event loop when it may carry images: reading an image part decodes it
(and may fetch it, for up to the fetch time limit), which must not stall the loop that streams
every other reply. Text-only bodies are parsed in place (no thread hop on the common path)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def parse_body_off_loop(body: Any, parse: Callable[[], T]) -> T:
    """``parse()`` (which reads ``body``), on a worker thread when the body has content parts."""
    if _has_parts(body):
        return await asyncio.to_thread(parse)
    return parse()


def _has_parts(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    turns = body.get("messages", body.get("input"))
    return isinstance(turns, list) and any(
        isinstance(turn, dict) and isinstance(turn.get("content"), list) for turn in turns
    )
