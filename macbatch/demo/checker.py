"""Scoring demo replies: a reply is right when it equals the expected text, whitespace stripped."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from macbatch.demo.tasks import Example


def is_correct(reply: str, expected: str) -> bool:
    """Exact match after stripping surrounding whitespace (the batch runner's rule too)."""
    return reply.strip() == expected.strip()


def accuracy_by_task(examples: Sequence[Example], replies: Sequence[str]) -> dict[str, float]:
    """Fraction of correct replies per task, in the order tasks first appear."""
    if len(examples) != len(replies):
        raise ValueError(f"{len(examples)} examples but {len(replies)} replies")
    hits: dict[str, list[bool]] = defaultdict(list)
    for example, reply in zip(examples, replies):
        hits[example.task].append(is_correct(reply, example.answer))
    return {task: sum(h) / len(h) for task, h in hits.items()}
