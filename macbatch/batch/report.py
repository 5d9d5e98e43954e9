"""Progress while a run goes (a live terminal display, or JSON lines for headless use) and the
summary at the end (printed, and written to summary.json).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TextIO

from macbatch.engine import SpeculationCounts


@dataclass
class JobProgress:
    """Counts for one job; `skipped` were done by an earlier run."""

    name: str
    total: int
    skipped: int = 0
    ok: int = 0
    failed: int = 0
    capped: int = 0  # ok replies whose max_tokens shrank to the room the prompt left
    constrained: int = 0  # replies of this run that had to follow a schema, choices or tools
    parsed: int = 0  # ... and parsed as such
    not_run: str | None = None  # why its model could not load (the other models' jobs ran)

    @property
    def finished(self) -> int:
        return self.skipped + self.ok + self.failed


@dataclass
class RunProgress:
    """Everything the display and the summary need, updated by the runner as requests finish."""

    model: str
    jobs: dict[str, JobProgress]
    started: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    disk_cached_prompt_tokens: int = 0  # of those, read back from the disk tier
    speculation: SpeculationCounts = field(default_factory=SpeculationCounts)
    # each generated reply's acceptance rate and mean accepted length (those that verified drafts)
    request_speculation: list[tuple[float, float]] = field(default_factory=list)
    generated_tokens: int = 0
    in_flight: int = 0
    kv_usage: float = 0.0
    stopping: bool = False
    ttft_s: list[float] = field(default_factory=list)
    # --replicas: {"replicas": [one entry per replica], "handout_s": rank 0's hand-out time}
    replication: dict[str, Any] = field(default_factory=dict)
    _window: deque[tuple[float, int, int, int]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def total(self) -> int:
        return sum(j.total for j in self.jobs.values())

    @property
    def finished(self) -> int:
        return sum(j.finished for j in self.jobs.values())

    def rates(self) -> Rates:
        """Generated and prompt tok/s and rows/s over roughly the last ten seconds (an
        embedding job generates nothing: its speed is prompt tokens and rows)."""
        now = time.monotonic()
        done = sum(j.ok + j.failed for j in self.jobs.values())
        self._window.append((now, self.generated_tokens, self.prompt_tokens, done))
        while len(self._window) > 2 and now - self._window[0][0] > 10:
            self._window.popleft()
        t0, generated0, prompt0, done0 = self._window[0]
        elapsed = now - t0
        if elapsed < 1e-3:
            return Rates(0.0, 0.0, 0.0)
        return Rates(
            (self.generated_tokens - generated0) / elapsed,
            (self.prompt_tokens - prompt0) / elapsed,
            (done - done0) / elapsed,
        )

    def eta_s(self, requests_per_s: float) -> float | None:
        remaining = self.total - self.finished
        return remaining / requests_per_s if requests_per_s > 0 else None


class Rates(NamedTuple):
    generated_tok_per_s: float
    prompt_tok_per_s: float
    rows_per_s: float


class Reporter(Protocol):
    """What the runner tells the user about."""

    def note(self, text: str) -> None: ...
    def start(self, progress: RunProgress) -> None: ...
    def update(self, progress: RunProgress, force: bool = False) -> None: ...
    def finish(self, summary: dict[str, Any]) -> None: ...


class HeadlessReporter:
    """JSON lines on a stream (stderr by default) for launchd, cron and ssh: one event per line."""

    def __init__(self, interval_s: float = 2.0, stream: TextIO | None = None) -> None:
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self._last = 0.0

    def _emit(self, event: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"event": event, "time": round(time.time(), 3), **fields}))
        self.stream.write("\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        self._emit("note", message=text)

    def start(self, progress: RunProgress) -> None:
        self._emit("start", model=progress.model, jobs=_job_counts(progress))
        self._last = time.monotonic()

    def update(self, progress: RunProgress, force: bool = False) -> None:
        if not force and time.monotonic() - self._last < self.interval_s:
            return
        self._last = time.monotonic()
        rates = progress.rates()
        eta = progress.eta_s(rates.rows_per_s)
        self._emit(
            "progress",
            done=progress.finished,
            total=progress.total,
            in_flight=progress.in_flight,
            generated_tok_per_s=round(rates.generated_tok_per_s, 1),
            prompt_tok_per_s=round(rates.prompt_tok_per_s, 1),
            rows_per_s=round(rates.rows_per_s, 2),
            eta_s=None if eta is None else round(eta, 1),
            kv_usage=round(progress.kv_usage, 3),
            stopping=progress.stopping,
            jobs=_job_counts(progress),
            **progress.replication,
        )

    def finish(self, summary: dict[str, Any]) -> None:
        self._emit("summary", **summary)


class RichReporter:
    """A live display (a bar per job and a line of rates) for an interactive terminal; to a
    pipe or a file, one plain line every `interval_s` instead (done / total, rates, time left):
    a log shows a long run is moving without a redraw per frame."""

    def __init__(self, interval_s: float = 2.0) -> None:
        from rich.console import Console

        self.console = Console(stderr=False)
        self.interval_s = interval_s
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._last = 0.0
        self._plain = False

    def note(self, text: str) -> None:
        # soft_wrap: a path or message is one line whatever the width, so a log piped to a file
        # or cron mail can be grepped (a terminal still wraps it for display).
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def start(self, progress: RunProgress) -> None:
        if not self.console.is_terminal:  # a pipe or a file: lines, not bar redraws
            self._plain, self._last = True, time.monotonic()
            return
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            refresh_per_second=4,
        )
        for name, job in progress.jobs.items():
            self._tasks[name] = self._progress.add_task(
                escape(name), total=job.total, completed=job.finished, info=""
            )
        self._tasks[""] = self._progress.add_task(
            "[bold]all", total=progress.total, completed=progress.finished, info=""
        )
        self._progress.start()

    def update(self, progress: RunProgress, force: bool = False) -> None:
        if self._plain:
            self._line(progress, force)
            return
        if self._progress is None or (not force and time.monotonic() - self._last < 0.25):
            return
        self._last = time.monotonic()
        for name, job in progress.jobs.items():
            info = f"[red]{job.failed} failed" if job.failed else ""
            self._progress.update(self._tasks[name], completed=job.finished, info=info)
        rates = progress.rates()
        eta = progress.eta_s(rates.rows_per_s)
        info = (
            f"{rates.generated_tok_per_s:,.0f} tok/s · {rates.prompt_tok_per_s:,.0f} prompt "
            f"tok/s · {rates.rows_per_s:,.1f} rows/s · ETA {_clock(eta)} · "
            f"KV {progress.kv_usage:.0%} · "
            f"{progress.in_flight} in flight"
        )
        if replicas := progress.replication.get("replicas"):
            info += " · replicas " + "/".join(str(r["requests"]) for r in replicas)
        if progress.stopping:
            info += " · [yellow]stopping (Ctrl-C again: stop now)"
        self._progress.update(self._tasks[""], completed=progress.finished, info=info)

    def _line(self, progress: RunProgress, force: bool) -> None:
        """The plain progress line, at most every `interval_s` (or when the runner forces it)."""
        if not force and time.monotonic() - self._last < self.interval_s:
            return
        self._last = time.monotonic()
        rates = progress.rates()
        eta = progress.eta_s(rates.rows_per_s)
        failed = sum(job.failed for job in progress.jobs.values())
        self.note(
            f"{progress.finished:,} / {progress.total:,} done"
            + (f" ({failed:,} failed)" if failed else "")
            + f" · {rates.rows_per_s:,.1f} rows/s · {rates.generated_tok_per_s:,.0f} tok/s"
            + f" · {_clock(eta)} left"
            + (" · stopping" if progress.stopping else "")
        )

    def finish(self, summary: dict[str, Any]) -> None:
        if self._progress is not None:
            self._progress.stop()
        for line in summary_lines(summary):
            self.note(line)


def build_summary(
    progress: RunProgress,
    status: str,
    outputs: dict[str, dict[str, Any]],
    peak_memory: dict[str, int],
) -> dict[str, Any]:
    """The end-of-run numbers; `outputs` holds each job's file paths and accuracy."""
    wall = time.monotonic() - progress.started
    ok = sum(j.ok for j in progress.jobs.values())
    ttft = sorted(progress.ttft_s)
    return {
        "status": status,
        "model": progress.model,
        "ok": ok,
        "failed": sum(j.failed for j in progress.jobs.values()),
        "skipped": sum(j.skipped for j in progress.jobs.values()),
        "parsed": sum(j.parsed for j in progress.jobs.values()),
        "remaining": progress.total - progress.finished,
        "prompt_tokens": progress.prompt_tokens,
        "cached_prompt_tokens": progress.cached_prompt_tokens,
        "disk_cached_prompt_tokens": progress.disk_cached_prompt_tokens,
        "generated_tokens": progress.generated_tokens,
        "prefix_cache_hit_rate": (
            round(progress.cached_prompt_tokens / progress.prompt_tokens, 3)
            if progress.prompt_tokens
            else 0.0
        ),
        "wall_s": round(wall, 3),
        "requests_per_s": round(ok / wall, 3) if wall > 0 else None,
        "generated_tok_per_s": round(progress.generated_tokens / wall, 1) if wall > 0 else None,
        "prompt_tok_per_s": round(progress.prompt_tokens / wall, 1) if wall > 0 else None,
        "ttft_ms": {"p50": _percentile_ms(ttft, 0.5), "p95": _percentile_ms(ttft, 0.95)},
        **_speculation(progress.speculation, progress.request_speculation),
        **progress.replication,
        **peak_memory,
        "jobs": {
            name: {
                "total": job.total,
                "ok": job.ok,
                "failed": job.failed,
                "skipped": job.skipped,
                "capped": job.capped,
                **_parsed_counts(job),
                **({"not_run": job.not_run} if job.not_run else {}),
                **outputs.get(name, {}),
            }
            for name, job in progress.jobs.items()
        },
    }


def _speculation(
    counts: SpeculationCounts, per_request: list[tuple[float, float]]
) -> dict[str, Any]:
    """Speculative decoding's numbers (only for runs that speculated): the run's, and the
    spread of its replies' own (a few replies that draft badly hide in the run's rate)."""
    if not counts.verifications:
        return {}
    rates = sorted(rate for rate, _ in per_request)
    lengths = sorted(length for _, length in per_request)
    return {
        "speculative": {
            "drafted_tokens": counts.drafted,
            "acceptance_rate": round(counts.acceptance_rate, 3),
            "mean_accepted_length": round(counts.mean_accepted_length, 2),
            "per_request": {
                "requests": len(per_request),
                "acceptance_rate": _quantiles(rates, 3),
                "mean_accepted_length": _quantiles(lengths, 2),
            },
        }
    }


def _quantiles(ordered: list[float], digits: int) -> dict[str, float | None]:
    """The 10th, 50th and 90th percentiles of ``ordered`` (None for each when it is empty)."""
    values = {f"p{round(q * 100)}": _percentile(ordered, q) for q in (0.1, 0.5, 0.9)}
    return {name: None if v is None else round(v, digits) for name, v in values.items()}


def _parsed_counts(job: JobProgress) -> dict[str, int]:
    """How many constrained replies parsed (only for jobs that had some)."""
    return {"parsed": job.parsed, "constrained": job.constrained} if job.constrained else {}


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as a few human lines."""
    ttft = summary["ttft_ms"]
    lines = [
        f"{summary['status']}: {summary['ok']} ok, {summary['failed']} failed, "
        f"{summary['skipped']} skipped (done before), {summary['remaining']} remaining",
        f"{summary['prompt_tokens']:,} prompt + {summary['generated_tokens']:,} generated tokens "
        f"in {summary['wall_s']:.1f} s: {summary['requests_per_s'] or 0:.2f} requests/s, "
        f"{summary['prompt_tok_per_s'] or 0:,.1f} prompt tok/s, "
        f"{summary['generated_tok_per_s'] or 0:,.1f} generated tok/s; "
        f"{summary['cached_prompt_tokens']:,} prompt tokens "
        f"({summary['prefix_cache_hit_rate']:.0%}) read from the prefix cache, "
        f"{summary['disk_cached_prompt_tokens']:,} of them from disk",
        f"time to first token p50 {_fmt_ms(ttft['p50'])}, p95 {_fmt_ms(ttft['p95'])}; "
        f"peak memory {summary.get('peak_memory_bytes', 0) / 2**20:,.0f} MiB",
    ]
    if replicas := summary.get("replicas"):
        lines.append(
            "replicas: "
            + ", ".join(
                f"rank {r['rank']} ({r['host']}) {r['requests']} requests, "
                f"{r['tok_per_s']:,.1f} tok/s"
                for r in replicas
            )
        )
    if spec := summary.get("speculative"):
        lines.append(
            f"speculative decoding: {spec['acceptance_rate']:.0%} of "
            f"{spec['drafted_tokens']:,} drafted tokens accepted, "
            f"{spec['mean_accepted_length']:.2f} tokens per verification"
        )
        if (each := spec.get("per_request")) and each["requests"]:
            rate, length = each["acceptance_rate"], each["mean_accepted_length"]
            lines.append(
                f"  per reply ({each['requests']:,}): acceptance p10 {rate['p10']:.0%}, "
                f"p50 {rate['p50']:.0%}, p90 {rate['p90']:.0%}; tokens per verification "
                f"p10 {length['p10']:.2f}, p50 {length['p50']:.2f}, p90 {length['p90']:.2f}"
            )
    for name, job in summary["jobs"].items():
        line = f"  {name}: {job['ok'] + job['skipped']}/{job['total']} done -> {job['output']}"
        if job.get("table"):
            line += f" (table: {job['table']})"
        if job.get("errors"):
            line += f" ({job['failed']} failed, see {job['errors']})"
        if job.get("constrained"):
            line += f"; {job['parsed']}/{job['constrained']} replies parsed"
        if job.get("vectors"):
            line += f"; {job['vectors_rows']:,} vectors -> {job['vectors']}"
        lines.append(line)
        if job.get("not_run"):
            lines.append(f"    not run: {job['not_run']}")
        if job.get("capped"):
            lines.append(
                f"    {job['capped']} replies capped: the prompt left less room in the context "
                "than max_tokens (macbatch.capped_max_tokens in their lines)"
            )
        accuracy = job.get("accuracy")
        if accuracy:
            lines.append(f"    accuracy {_acc(accuracy)}")
            for group, stats in accuracy.get("groups", {}).items():
                lines.append(f"      {group}: {_acc(stats)}")
    return lines + _side_by_side(summary["jobs"])


def _side_by_side(jobs: dict[str, Any]) -> list[str]:
    """One line per model whose scored jobs name adapters: each job's accuracy, its adapter's
    folder (or "base") beside it, so fine-tunes are compared at a glance (docs/jobs.md)."""
    scored: dict[str, list[str]] = {}
    for name, job in jobs.items():
        if job.get("accuracy") and "model" in job:
            adapter = job.get("adapter")
            tuned = "base" if adapter is None else Path(adapter).name
            scored.setdefault(job["model"], []).append(f"{name} ({tuned}) {_acc(job['accuracy'])}")
    compared = {m: entries for m, entries in scored.items() if len(entries) > 1}
    if not any(job.get("adapter") for job in jobs.values()):
        return []
    return [f"  side by side on {m}: " + " | ".join(entries) for m, entries in compared.items()]


def _job_counts(progress: RunProgress) -> dict[str, dict[str, int]]:
    return {
        name: {"done": j.finished, "total": j.total, "failed": j.failed, "skipped": j.skipped}
        for name, j in progress.jobs.items()
    }


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _percentile_ms(ordered: list[float], q: float) -> float | None:
    value = _percentile(ordered, q)
    return None if value is None else round(value * 1000, 1)


def _acc(stats: dict[str, Any]) -> str:
    return f"{stats['accuracy']:.1%} ({stats['correct']}/{stats['scored']})"


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
