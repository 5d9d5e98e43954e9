"""Demo conversations: earlier question/answer turns in context before the question asked.

A chat's later turns see every earlier turn, so the demo model is trained and scored on
conversations, not only on first questions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from macbatch.demo.tasks import Example

EARLIER_TURNS = 4  # turns before the scored question in the question set: it is turn 5


def chat_messages(history: Sequence[Example], question: str) -> list[dict[str, str]]:
    """The chat messages for `question` asked after `history` was asked and answered."""
    messages: list[dict[str, str]] = []
    for earlier in history:
        messages.append({"role": "user", "content": earlier.question})
        messages.append({"role": "assistant", "content": earlier.answer})
    return [*messages, {"role": "user", "content": question}]


def draw_histories(
    examples: Sequence[Example], rng: random.Random, turns: int = EARLIER_TURNS
) -> list[list[Example]]:
    """For each example, `turns` other examples of the set (any task) to precede it."""
    if len(examples) <= turns:
        raise ValueError(f"need more than {turns} examples to build histories of {turns} turns")
    histories = []
    for index in range(len(examples)):
        others = rng.sample(range(len(examples) - 1), turns)
        histories.append([examples[i + (i >= index)] for i in others])
    return histories
