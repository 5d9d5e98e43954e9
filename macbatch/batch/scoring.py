"""Exact-match scoring of replies, and accuracy per job and per group from the ledger.

Accuracy is computed from the ledger rather than from this run's counters, so a resumed job
reports on all of its lines, not only the ones finished since the restart.
"""

from __future__ import annotations

from typing import Any

from macbatch.batch.ledger import Ledger


def is_correct(reply: str, expected: str | None) -> bool | None:
    """True/False for an exact match after stripping whitespace; None when there is no answer."""
    if expected is None:
        return None
    return reply.strip() == expected.strip()


def accuracy(ledger: Ledger, job: str) -> dict[str, Any] | None:
    """{scored, correct, accuracy, groups: {group: {...}}} over the job's scored requests."""
    rows = ledger.scores(job)
    if not rows:
        return None
    scored = sum(count for _, count, _ in rows)
    correct = sum(hits for _, _, hits in rows)
    result: dict[str, Any] = _stats(scored, correct)
    groups = {group: _stats(count, hits) for group, count, hits in rows if group is not None}
    if groups:
        result["groups"] = groups
    return result


def _stats(scored: int, correct: int) -> dict[str, Any]:
    return {"scored": scored, "correct": correct, "accuracy": round(correct / scored, 4)}
