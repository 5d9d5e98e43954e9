"""The dry pass before the model loads: count each job's work and compare it with the ledger.

It reads every input once (lazily, keeping only ids), so the progress display knows the totals,
duplicate ids are caught before anything runs, and a job whose settings or rows changed since the
last run is reported by name instead of silently mixing old and new results in one file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from macbatch.batch.inputs import InputFile
from macbatch.batch.ledger import Ledger
from macbatch.batch.plan import Planned, plan_job
from macbatch.batch.spec import JobSpec
from macbatch.batch.yamlfile import JobFileError


@dataclass
class JobSurvey:
    """One job's work: requests (n per row), unreadable rows, done before, changed since."""

    name: str
    requests: int = 0
    rejected: int = 0
    done: int = 0
    changed: int = 0
    first_changed: Planned | None = None
    changed_requests: set[tuple[str, int]] = field(default_factory=set)  # (custom_id, sample)

    @property
    def total(self) -> int:
        return self.requests + self.rejected


def survey_job(job: JobSpec, source: InputFile | None, ledger: Ledger) -> JobSurvey:
    """Count `job`'s requests against the ledger; JobFileError on an empty job or duplicate ids."""
    result = JobSurvey(job.name)
    first_line: dict[str, int] = {}
    for item in plan_job(job, job.model, source):
        if not isinstance(item, Planned):
            result.rejected += 1
            continue
        if item.sample == 0:
            if item.custom_id in first_line:
                raise JobFileError(_duplicate(job, source, item, first_line[item.custom_id]))
            first_line[item.custom_id] = item.line
        result.requests += 1
        recorded = ledger.lookup(job.name, item.custom_id, item.sample)
        if recorded == item.key:
            result.done += 1
        elif recorded is not None:
            result.changed += 1
            result.first_changed = result.first_changed or item
            result.changed_requests.add((item.custom_id, item.sample))
    if result.total == 0:
        where = f"{source.path} has no rows" if source else "it has no prompts"
        raise JobFileError(f"job '{job.name}' is empty: {where}")
    return result


def change_report(job: JobSpec, survey: JobSurvey, old: dict[str, Any] | None, new: dict) -> str:
    """Say what changed in a job since its completed requests ran."""
    what = ", ".join(_differences(old or {}, new)) or (
        f"input rows changed (first: id '{survey.first_changed.custom_id}' "
        f"on line {survey.first_changed.line})"
        if survey.first_changed
        else "its requests changed"
    )
    return (
        f"job '{job.name}' changed since its last run ({what}): {survey.changed} completed "
        "requests would now give different results"
    )


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return changes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _duplicate(job: JobSpec, source: InputFile | None, item: Planned, first: int) -> str:
    where = f"{source.path} line" if source else "prompts item"
    fix = (
        "make input.id produce unique ids (e.g. add another field to it)"
        if source
        else "give each prompt its own id"
    )
    return (
        f"job '{job.name}': duplicate id '{item.custom_id}' at {where} {item.line} "
        f"(first used at {where} {first}); ids must be unique within a job: {fix}"
    )
