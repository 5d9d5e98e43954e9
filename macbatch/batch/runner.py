"""Runs a validated job file: every job's requests stream through its model's engine, resumably.

Order of work: check every input's header, recover output files after a crash, survey all jobs
against the ledger (totals, duplicates, changed jobs, rows another model answered), and only then
load a model. Jobs run grouped by their model, each model loaded once and freed before the next
(docs/jobs.md, "A model per job"). For each group the loop admits requests round-robin across its
jobs while fewer than `max_in_flight` are queued or running, steps the engine, and writes each
finished request as one line before recording it (and the model that answered it) in the ledger.
All MLX work happens on the calling thread.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from macbatch.batch.inputs import InputFile
from macbatch.batch.ledger import Ledger
from macbatch.batch.outputs import JsonlAppender, drop_results, error_line, recover, write_result
from macbatch.batch.paths import (
    LEDGER_NAME,
    SUMMARY_NAME,
    errors_path,
    output_path,
    rebuilt_files,
    temporary,
)
from macbatch.batch.pending import Pending
from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.preparing import Preparing
from macbatch.batch.replies import ParsedReply, ReplyShape, scored_answer
from macbatch.batch.report import JobProgress, Reporter, RunProgress, build_summary
from macbatch.batch.run_guard import (
    Interrupts,
    caught_signals,
    exclusive,
    refuse_inputs_among_outputs,
)
from macbatch.batch.scoring import accuracy, is_correct
from macbatch.batch.spec import JobFile, JobSpec
from macbatch.batch.survey import change_report, survey_job
from macbatch.batch.table import write_job_tables
from macbatch.batch.vectors import write_job_vectors
from macbatch.batch.yamlfile import JobFileError
from macbatch.engine import ReplicatedEngine, Request, RequestOutput, per_request_speculation

MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class RunOptions:
    """How to treat earlier results, and how much work may be queued in the engine at once."""

    force: bool = False
    fresh: bool = False
    redo_changed: bool = False
    max_in_flight: int = 256


def run_jobs(
    job_file: JobFile,
    options: RunOptions,
    reporter: Reporter,
    load_engine: Callable[[str], Any],
    close_engine: Callable[[Any], None] = lambda engine: None,
) -> dict[str, Any]:
    """Run (or resume) every job of `job_file`; returns the summary (also written to disk).
    ``load_engine(model)`` loads each model once (JobFileError: it cannot; its jobs are
    skipped, the others run, and the summary's status is "incomplete"); ``close_engine`` frees
    one before the next.

    Raises JobFileError, before a model loads, for any problem with the file or its inputs, and
    when no job's model loads.
    """
    refuse_inputs_among_outputs(job_file)
    sources = {job.name: prepare(job) for job in job_file.jobs}
    directory = job_file.output_dir
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JobFileError(f"cannot create the output directory {directory}: {exc}") from None
    with exclusive(directory):
        ledger = Ledger(directory / LEDGER_NAME)
        try:
            jobs = _survey(job_file, sources, ledger, options, reporter)
            done = sum(job.skipped for job in jobs.values())
            if done:
                total = sum(job.total for job in jobs.values())
                reporter.note(f"resuming: {done:,} of {total:,} requests done before")
            loaded = _loaded(job_file, load_engine, close_engine, reporter, jobs)
            first = next(loaded, None)  # Ctrl-C until here: nothing ran
            if first is None:
                raise JobFileError("\n".join(_not_run(jobs)))
            with caught_signals() as interrupts, closing(loaded):  # Ctrl-C stops the loop only
                progress = RunProgress(model=job_file.model, jobs=jobs)
                reporter.start(progress)
                engines, first = chain([first], loaded), None  # the loop holds the one engine
                for model, group, engine in engines:
                    progress.model = model  # the one the display shows as running
                    _Loop(group, sources, ledger, engine, options, reporter, progress).run(
                        interrupts
                    )
                    del engine  # its memory goes before the next model loads
                    if interrupts.count:
                        break
                progress.model = job_file.model
                status = _status(progress, any(job.not_run for job in jobs.values()))
                outputs = _job_outputs(job_file, ledger)
                write_job_vectors(job_file, outputs, reporter.note)
                write_job_tables(job_file, sources, outputs, reporter.note)
                summary = build_summary(progress, status, outputs, _peak_memory())
                _write_json(directory / SUMMARY_NAME, summary)
                reporter.finish(summary)
        finally:
            ledger.close()
    return summary


def _loaded(
    job_file: JobFile,
    load_engine: Callable[[str], Any],
    close_engine: Callable[[Any], None],
    reporter: Reporter,
    jobs: dict[str, JobProgress],
) -> Generator[tuple[str, tuple[JobSpec, ...], Any], None, None]:
    """Each model's jobs with its engine, one model loaded at a time and closed before the next.
    A model that cannot load (``load_engine`` raises JobFileError) skips only its own jobs, each
    marked with why: one broken model must not stop the others' jobs."""
    for model, group in job_file.by_model().items():
        reporter.note(f"Loading model {model} ...")
        try:
            engine = load_engine(model)
        except JobFileError as exc:
            for job in group:
                jobs[job.name].not_run = str(exc)
            reporter.note(f"{', '.join(job.name for job in group)}: not run: {exc}")
            continue
        try:
            yield model, group, engine
        finally:
            close_engine(engine)
            del engine  # before the next model loads


def _not_run(jobs: dict[str, JobProgress]) -> list[str]:
    """A line per job whose model could not load: the job, and why (which names the model)."""
    return [f"job {job.name} was not run: {job.not_run}" for job in jobs.values() if job.not_run]


def _status(progress: RunProgress, skipped: bool) -> str:
    """complete; incomplete (a job's model did not load); else interrupted (Ctrl-C, a lost
    replica: stopped before the end, resumable)."""
    if progress.finished == progress.total:
        return "complete"
    return "incomplete" if skipped else "interrupted"


def _survey(
    job_file: JobFile,
    sources: dict[str, InputFile | None],
    ledger: Ledger,
    options: RunOptions,
    reporter: Reporter,
) -> dict[str, JobProgress]:
    """Recover files, count work, refuse changed jobs (unless --force), clear errors files."""
    directory = job_file.output_dir
    changed: list[str] = []
    jobs: dict[str, JobProgress] = {}
    for job in job_file.jobs:
        output = output_path(directory, job.name)
        if options.fresh:
            ledger.forget(job.name, settings=True)
            output.unlink(missing_ok=True)
        found = recover(output, ledger, job.name)
        if found.rebuilt:
            reporter.note(f"{output} is shorter than last recorded: its missing lines will rerun")
        if found.truncated_bytes:
            reporter.note(f"{output}: removed a partial last line ({found.truncated_bytes} bytes)")
        if found.unreadable_lines:
            reporter.note(f"{output}: {found.unreadable_lines} lines are not macbatch results")
        survey = survey_job(job, sources[job.name], ledger)
        if options.redo_changed and survey.changed:
            dropped = drop_results(output, survey.changed_requests)
            ledger.forget(job.name, settings=False)
            recover(output, ledger, job.name)
            reporter.note(
                f"{job.name}: {dropped} results whose rows or settings changed were removed "
                f"from {output}; they run again"
            )
            survey = survey_job(job, sources[job.name], ledger)
        settings = json.loads(json.dumps(job.settings()))
        if survey.changed and not options.force:
            changed.append(change_report(job, survey, ledger.settings(job.name), settings))
        elif options.force and (mixed := other_models(job, ledger)):
            raise JobFileError(mixed)
        jobs[job.name] = JobProgress(job.name, total=survey.total, skipped=survey.done)
        if options.force:
            jobs[job.name].skipped += survey.changed
    if changed:
        raise JobFileError(
            "\n".join(changed)
            + "\nRerun with --redo-changed to run exactly the changed requests again (their old "
            "lines are removed), --force to keep every completed line as it is and run only the "
            "missing ones, or --fresh to discard this job file's results and start over."
        )
    # From here the results change: what described the last run goes (rewritten when this one
    # ends), so a kill leaves no summary saying "complete" beside a partial file, nor the old
    # run's table beside the new run's lines.
    (directory / SUMMARY_NAME).unlink(missing_ok=True)
    for job in job_file.jobs:
        ledger.save_settings(job.name, job.settings())
        errors_path(directory, job.name).unlink(missing_ok=True)
        for path in rebuilt_files(directory, job, job_file.parquet):
            path.unlink(missing_ok=True)
    return jobs


class _Loop:
    """The admit / step / write loop of one model's jobs over its engine."""

    def __init__(
        self,
        jobs: tuple[JobSpec, ...],
        sources: dict[str, InputFile | None],
        ledger: Ledger,
        engine: Any,
        options: RunOptions,
        reporter: Reporter,
        progress: RunProgress,
    ) -> None:
        self.ledger, self.engine = ledger, engine
        self.options, self.reporter, self.progress = options, reporter, progress
        self.model = jobs[0].model
        self.output_dir = ledger.path.parent
        self.feed = _round_robin([plan_job(job, job.model, sources[job.name]) for job in jobs])
        self.outputs = {
            job.name: JsonlAppender(output_path(self.output_dir, job.name)) for job in jobs
        }
        self.scores = {job.name: job.score for job in jobs if job.score is not None}
        self.jobs = {job.name: job for job in jobs}
        self.body_rows = {  # rows that are API bodies: their sampling is their own
            job.name: (source := sources[job.name]) is not None and source.format == "openai"
            for job in jobs
        }
        self.errors: dict[str, JsonlAppender] = {}
        self.pending: Pending[tuple[Planned, ReplyShape | None]] = Pending()  # lines in flight
        # lines being templated and tokenized off this thread: a huge one holds up no other
        self.preparing: Preparing[tuple[Planned, ReplyShape | None], Request] = Preparing(
            lambda request: engine.prepare_request(*request, None)
        )

    def run(self, interrupts: Interrupts) -> None:
        """Run until the jobs are done or the user interrupts."""
        try:
            while True:
                if interrupts.count and not self.progress.stopping:
                    self.progress.stopping = True
                    self.reporter.note(
                        f"Stopping: no new requests; finishing {len(self.pending)} in "
                        "flight. Press Ctrl-C again to stop now."
                    )
                self._stop_if_replica_lost()
                if interrupts.count >= 2:
                    for request_id in self.pending.request_ids():
                        self.engine.abort(request_id)
                    break
                if not self.progress.stopping:
                    self._admit()
                self._queue_prepared(wait=not self.pending)
                if not self.pending and not self.preparing:
                    break
                for output in self.engine.step():
                    if output.finished:
                        self._finish(output)
                self._update()
        finally:
            self.preparing.close()
            for appender in (*self.outputs.values(), *self.errors.values()):
                appender.close()
        self._update(force=True)

    def _stop_if_replica_lost(self) -> None:
        """A replica lost (``--replicas``): stop as on a first Ctrl-C; its rows come back
        unwritten, and the rows rank 0 runs itself finish."""
        lost = self.engine.lost if isinstance(self.engine, ReplicatedEngine) else None
        if lost is not None and not self.progress.stopping:
            self.progress.stopping = True
            self.reporter.note(
                f"Stopping: {lost.rstrip('.')}; finishing {len(self.pending)} in flight."
            )

    def _admit(self) -> None:
        """Start preparing lines' engine requests while fewer than ``max_in_flight`` are
        being prepared, queued or running (and the preparing pool has room)."""
        engine = self.engine
        while self._in_flight() < self.options.max_in_flight and self.preparing.has_room:
            item = next(self.feed, None)
            if item is None:
                return
            if isinstance(item, Rejected):
                self._fail(item, item.reason, "invalid_input")
                continue
            if self.ledger.lookup(item.job, item.custom_id, item.sample) is not None:
                continue
            try:
                bound = item.bind(engine.info.model, engine.tokenizer)
            except Exception as exc:  # a tool the model cannot honour ...
                self._fail(item, str(exc), "invalid_request")
                continue
            self.preparing.start((item, bound.shape), item.key, bound.requests)

    def _queue_prepared(self, wait: bool) -> None:
        """Queue the lines done preparing in the engine (all of a line's requests, or none and
        its error line); ``wait``: for one, when nothing else would let the loop go on."""
        engine = self.engine

        def enqueue(request: Request) -> str:
            engine.enqueue(request)
            return request.request_id

        def fail(row: tuple[Planned, ReplyShape | None], why: str) -> None:
            self._fail(row[0], why, "invalid_request")

        self.preparing.queue_ready(self.pending, enqueue, engine.abort, fail, wait)

    def _in_flight(self) -> int:
        return len(self.pending) + len(self.preparing)

    def _finish(self, output: RequestOutput) -> None:
        if output.request_id not in self.pending:  # aborted when its line could not be queued
            return
        settled = self.pending.settle(output, self.engine.abort)
        if settled is None:
            return
        item, shape = settled.row
        if settled.error is not None:
            self._fail(item, settled.error, "engine_error")
            return
        outputs = settled.outputs
        body = item.reply_body(outputs, shape, self.model, self.engine.tokenizer)
        parsed: ParsedReply | None = None
        correct: bool | None = None
        if shape is not None:  # a generated line: scored and parsed on its first choice
            parsed = shape.parse(outputs[0].text)
            score = self.scores.get(item.job)
            answer = scored_answer(outputs[0].text, parsed, score.parsed if score else None)
            correct = is_correct(answer, item.expected)
        write_result(self.outputs[item.job], self.ledger, item, outputs, body, correct, parsed)
        self._count(item, outputs, parsed)

    def _count(self, item: Planned, outs: list[RequestOutput], parsed: ParsedReply | None) -> None:
        """A written line's share of the summary: the tokens of each of its requests, and each
        generated reply's time to first token and speculation."""
        metrics = self.progress
        job = metrics.jobs[item.job]
        job.ok += 1
        if self._asked_max_tokens(item):  # a default cut to the room left is no surprise
            job.capped += any(o.capped_max_tokens is not None for o in outs)
        if parsed is not None:
            job.constrained += 1
            job.parsed += parsed.ok
        for output in outs:
            metrics.prompt_tokens += output.metrics.prompt_tokens
            metrics.cached_prompt_tokens += output.metrics.cached_tokens
            metrics.disk_cached_prompt_tokens += output.metrics.disk_cached_tokens
            if item.pooled is not None:
                continue
            metrics.generated_tokens += output.metrics.generated_tokens
            spec = output.metrics.speculation
            metrics.speculation.add(spec.drafted, spec.accepted, spec.verifications)
            if per_request := per_request_speculation(spec):
                metrics.request_speculation.append(per_request)
            if output.metrics.time_to_first_token_s is not None:
                metrics.ttft_s.append(output.metrics.time_to_first_token_s)

    def _asked_max_tokens(self, item: Planned) -> bool:
        """Whether the job file (or, for an OpenAI-batch row, its body) set max_tokens."""
        job = self.jobs[item.job]
        written = item.sampling if self.body_rows[item.job] else job.given_sampling
        return any(name in written for name in MAX_TOKENS_FIELDS)

    def _fail(self, item: Planned | Rejected, reason: str, code: str) -> None:
        if item.job not in self.errors:
            path = errors_path(self.output_dir, item.job)
            self.errors[item.job] = JsonlAppender(path)
        self.errors[item.job].append(error_line(item, reason, code))
        self.progress.jobs[item.job].failed += 1

    def _update(self, force: bool = False) -> None:
        self.progress.in_flight = self._in_flight()
        self.progress.kv_usage = self.engine.stats().kv_usage
        if isinstance(self.engine, ReplicatedEngine):
            self.progress.replication = self.engine.replica_stats()
        self.reporter.update(self.progress, force)


def other_models(job: JobSpec, ledger: Ledger) -> str | None:
    """Why ``--force`` cannot keep a job's lines: other models answered some (None: it can).
    A job's file holds one model's answers, so a changed model reruns (--redo-changed) or
    starts over (--fresh); lines recorded before the ledger kept models count as the job's."""
    others = {m: n for m, n in ledger.models(job.name).items() if m not in (None, job.model)}
    if not others:
        return None
    by = ", ".join(f"{n} by {m}" for m, n in others.items())
    return (
        f"job '{job.name}' now runs on {job.model}, but {sum(others.values())} of its completed "
        f"lines were answered by another model ({by}); --force would mix two models' answers "
        "in one file. Rerun with --redo-changed to answer those lines again with the new model, "
        "or --fresh to start the job over."
    )


def _round_robin(
    iterators: list[Iterator[Planned | Rejected]],
) -> Iterator[Planned | Rejected]:
    """One item from each job in turn, so all jobs progress together through the one engine."""
    queue = deque(iterators)
    while queue:
        iterator = queue.popleft()
        item = next(iterator, None)
        if item is not None:
            queue.append(iterator)
            yield item


def _job_outputs(job_file: JobFile, ledger: Ledger) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for job in job_file.jobs:
        entry: dict[str, Any] = {
            "model": job.model,  # the summary's top-level "model" is the file's
            "output": str(output_path(job_file.output_dir, job.name)),
        }
        if job.adapter:
            entry["adapter"] = job.adapter
        errors = errors_path(job_file.output_dir, job.name)
        if errors.exists():
            entry["errors"] = str(errors)
        if job.score is not None:
            entry["accuracy"] = accuracy(ledger, job.name)
        result[job.name] = entry
    return result


def _peak_memory() -> dict[str, int]:
    import resource
    import sys

    import mlx.core as mx

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_memory_bytes": int(mx.get_peak_memory()),
        "max_rss_bytes": int(rss if sys.platform == "darwin" else rss * 1024),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a summary."""
    temporary(path).write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary(path), path)


def jobs_by_name(job_file: JobFile, names: list[str]) -> tuple[JobSpec, ...]:
    """The jobs named (all when `names` is empty); JobFileError for a name the file lacks."""
    if not names:
        return job_file.jobs
    known = {job.name: job for job in job_file.jobs}
    missing = [name for name in names if name not in known]
    if missing:
        raise JobFileError(
            f"no job named {', '.join(repr(m) for m in missing)} in {job_file.path}; "
            f"jobs: {', '.join(known)}"
        )
    return tuple(known[name] for name in names)
