"""Fitting a long chat into the model's context: the oldest turns are left out of the prompt.

A chat outgrows a small context (the demo model's is 512 tokens, about nine questions). Rather
than refusing the next message, the prompt keeps the system message and the newest turns that fit
while leaving room for a reply; the transcript and the history keep everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Messages = list[dict[str, Any]]
REPLY_SHARE = 4  # the room kept for a reply: max_tokens, but at most a quarter of the context


def reply_room(max_tokens: int, context: int) -> int:
    """Tokens a prompt must leave free for the reply."""
    return max(1, min(max_tokens, context // REPLY_SHARE))


def fit_to_context(
    messages: Messages, count_tokens: Callable[[Messages], int], limit: int
) -> tuple[Messages, int]:
    """The messages with the fewest oldest turns left out so `count_tokens` stays within `limit`,
    and how many messages were left out.

    A kept history starts at a user message; the system message and the last message always
    stay (if even they do not fit, the engine's error says so). Binary search: a long chat
    is rendered a handful of times, not once per turn.
    """
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    starts = [i for i, m in enumerate(turns) if m["role"] == "user" and i > 0]
    if count_tokens(messages) <= limit or not starts:
        return messages, 0
    low, high = 0, len(starts) - 1  # find the first start whose suffix fits; the last always kept
    while low < high:
        middle = (low + high) // 2
        if count_tokens(system + turns[starts[middle] :]) <= limit:
            high = middle
        else:
            low = middle + 1
    return system + turns[starts[low] :], starts[low]
