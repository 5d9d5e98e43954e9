"""`macbatch run FILE`: the typer command. Heavy imports (MLX, the engine) happen inside it, so
`macbatch --help` stays fast.
"""

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, NoReturn

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import (
    DISK_CACHE,
    SPECULATIVE,
    EngineKnobs,
    disk_cache_line,
    model_problem,
)

if TYPE_CHECKING:
    from macbatch.batch.report import Reporter
    from macbatch.batch.runner import RunOptions


class EngineOptions(NamedTuple):
    """The engine options given on run's command line that change results, so the resume hint
    repeats them; each None where the job file's (or the engine's default) applies."""

    kv_bits: int | None = None
    indexer_keys: str | None = None
    spec: dict[str, Any] | None = None  # the speculative options' EngineConfig fields


EXIT_FAILED_REQUESTS = 3
EXIT_INTERRUPTED = 130
MAX_IN_FLIGHT = 256
# run's engine knobs; those left unset (None) are the job file's
RUN_KNOBS = Pick(
    EngineKnobs,
    ("max_num_seqs", "kv_bits", "indexer_keys", *SPECULATIVE, *DISK_CACHE, "no_self_check"),
    names={"max_num_seqs": "--max-seqs"},  # its name since run began
    defaults={"speculative": None},
)


@takes(knobs=RUN_KNOBS)
def run_command(
    file: Annotated[
        Path,
        typer.Argument(
            help="The job file (YAML). See docs/jobs.md for every key.", show_default=False
        ),
    ],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Resume even though a job changed since its last run: KEEP every line already "
            "written, including answers to rows or settings that changed since (their old "
            "answers and scores stay), and run only the missing requests with the new settings.",
        ),
    ] = False,
    redo_changed: Annotated[
        bool,
        typer.Option(
            "--redo-changed",
            help="Resume a job that changed since its last run by running exactly the changed "
            "requests again (rows whose content changed, or all rows if the settings did): their "
            "old lines are removed from the output, everything else is kept.",
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start over: delete this job file's output files and resume records first.",
        ),
    ] = False,
    headless: Annotated[
        bool,
        typer.Option(
            "--headless",
            help="No live display: JSON-lines progress events on stderr (launchd, cron, ssh).",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Use this model instead of the file's: a Hugging Face id, a local path, or demo.",
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "--job",
            "-j",
            help="Run only the job with this name (repeat for several).",
            show_default=False,
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Write outputs here instead of the file's output.dir.",
            show_default=False,
        ),
    ] = None,
    max_in_flight: Annotated[
        int,
        typer.Option(
            "--max-in-flight",
            min=1,
            help="Requests queued or running in the engine at once; inputs are read only as fast "
            "as this allows, so memory stays flat for any input size.",
        ),
    ] = MAX_IN_FLIGHT,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            min=1,
            help="Under mlx.launch: run N whole-model replicas, one per rank, each on its share "
            "of the rows (rank 0 hands rows out and writes every file). Without it, the ranks "
            "split one model (tensor parallelism). docs/distributed.md",
            show_default=False,
        ),
    ] = None,
    *,
    knobs: EngineKnobs,
    progress_interval: Annotated[
        float,
        typer.Option(
            "--progress-interval",
            min=0.0,
            help="Seconds between progress lines when the output is not a terminal (a file, a "
            "pipe, CI logs), and between --headless progress events.",
        ),
    ] = 2.0,
) -> None:
    """Run the jobs of a YAML job file through one engine; rerun the same command to resume.

    Writes, per job, in the output directory: `<job>.jsonl` (a line per finished request, in
    OpenAI's batch output shape), `<job>.csv` (a flat table in input order: the input's columns,
    the reply, finish reason, error) and `<job>.errors.jsonl` (failures).

    Exit status: 0 all done, 1 could not run (or a job's model could not load: the other
    jobs ran), 3 some requests failed, 130 interrupted.
    """
    from macbatch.batch.report import HeadlessReporter, RichReporter
    from macbatch.batch.runner import RunOptions

    reporter = HeadlessReporter(progress_interval) if headless else RichReporter(progress_interval)
    if force and fresh:
        _fail(headless, "--force and --fresh contradict each other; choose one")
    if redo_changed and (force or fresh):
        _fail(headless, "--redo-changed goes alone: --force keeps changed lines, --fresh drops all")
    spec = None  # the job file's, unless an option is given
    if knobs.speculative is not None or knobs.draft_model:
        spec = knobs.speculative_fields()
    given = EngineOptions(knobs.kv_bits, knobs.indexer_keys, spec)
    summary = _run(
        file,
        RunOptions(
            force=force, fresh=fresh, redo_changed=redo_changed, max_in_flight=max_in_flight
        ),
        model,
        jobs or [],
        output_dir,
        knobs,
        given,
        reporter,
        headless,
        replicas,
    )
    if summary["status"] in ("interrupted", "incomplete"):
        again = resume_command(file, model, jobs or [], output_dir, given, headless, max_in_flight)
        if replicas is not None:  # the launcher's own arguments are not known here
            again += f" --replicas {replicas} (under mlx.launch, as before; or alone, without it)"
    if summary["status"] == "incomplete":
        skipped = [
            f"job {name} was not run: {job['not_run']}"
            for name, job in summary["jobs"].items()
            if job.get("not_run")
        ]
        _fail(
            headless,
            "\n".join(skipped) + "\nThe other jobs ran and their lines are saved; mend the model "
            "(or name another for those jobs) and run the same command again to run them: " + again,
        )
    if summary["status"] == "interrupted":
        reporter.note(
            f"Interrupted: {summary['remaining']} requests not done. Completed lines are saved; "
            f"run the same command again to resume: {again}"
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if summary["failed"]:
        raise typer.Exit(EXIT_FAILED_REQUESTS)


def resume_command(
    file: Path,
    model: str | None,
    jobs: list[str],
    output_dir: Path | None,
    engine_options: EngineOptions,
    headless: bool,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> str:
    """The command that resumes this run: the same file, model, jobs, output directory, KV
    and indexer-key formats, speculative options and --max-in-flight (without --force /
    --fresh / --redo-changed, which have done their work)."""
    kv_bits, indexer_keys, spec = engine_options
    words = ["macbatch", "run", str(file)]
    if model:
        words += ["-m", model]
    for name in jobs:
        words += ["-j", name]
    if output_dir:
        words += ["-o", str(output_dir)]
    if kv_bits is not None:
        words += ["--kv-bits", str(kv_bits)]
    if indexer_keys is not None:
        words += ["--indexer-keys", indexer_keys]
    if spec is not None:
        words += ["--speculative", spec["speculative"]]
        if spec["num_speculative_tokens"] is not None:
            words += ["--num-speculative-tokens", str(spec["num_speculative_tokens"])]
        words += ["--draft-model", spec["draft_model"]] if spec["draft_model"] else []
    if max_in_flight != MAX_IN_FLIGHT:
        words += ["--max-in-flight", str(max_in_flight)]
    if headless:
        words.append("--headless")
    return shlex.join(words)


def _run(
    file: Path,
    options: "RunOptions",
    model: str | None,
    jobs: list[str],
    output_dir: Path | None,
    knobs: EngineKnobs,
    engine_options: EngineOptions,
    reporter: "Reporter",
    headless: bool,
    replicas: int | None = None,
) -> dict:
    """Load, validate and run; every failure a user can cause ends as one clear message."""
    import dataclasses

    from macbatch import engine as engines
    from macbatch.batch.runner import jobs_by_name, run_jobs
    from macbatch.batch.spec import load_job_file
    from macbatch.batch.yamlfile import JobFileError
    from macbatch.engine import EngineConfig, load_replicas, replicas_problem

    disk: dict[str, Any] = {}  # never changes results: not in the resume hint
    untold: list[str] = []  # the disk cache's line, said once, as the first model loads

    def load_engine(name: str) -> object:
        hand_back_memory()
        while untold:
            reporter.note(untold.pop())  # headless: a note event
        config = dataclasses.replace(engine_config(), adapters=adapters_of.get(name, ()))
        if (too_large := run_fits(name, config.kv_start_mib)) is not None:
            raise JobFileError(f"{too_large} (the model of {', '.join(jobs_of[name])})")
        try:
            if replicas is not None:  # whole-model replicas, one per rank of mlx.launch
                return load_replicas(name, config, replicas)
            return engines.load_engine(name, config)
        except Exception as exc:  # load errors come in many types; all mean "cannot run"
            raise JobFileError(f"cannot load model '{name}': {exc}") from exc

    def engine_config() -> EngineConfig:
        given = engine_options  # an option given wins over the job file's key
        bits = given.kv_bits if given.kv_bits is not None else job_file.kv_bits
        keys = given.indexer_keys if given.indexer_keys is not None else job_file.indexer_keys
        # neither an option nor the job file's section: MTP where the checkpoint has heads
        speculative = given.spec or job_file.speculative or {"speculative": "auto"}
        return EngineConfig(
            kv_bits=bits,
            indexer_keys=keys,
            max_num_seqs=knobs.max_num_seqs,
            self_check=not knobs.no_self_check,
            **speculative,
            **disk,
        )

    try:
        job_file = load_job_file(file, model_override=model)
        job_file = dataclasses.replace(
            job_file,
            jobs=jobs_by_name(job_file, jobs),
            output_dir=output_dir or job_file.output_dir,
        )
        jobs_of = {m: [j.name for j in group] for m, group in job_file.by_model().items()}
        adapters_of = {  # each model's engine holds every adapter its jobs name
            m: tuple((a, a) for a in dict.fromkeys(j.adapter for j in group if j.adapter))
            for m, group in job_file.by_model().items()
        }
        for name, named in jobs_of.items():  # before any file is made
            if (problem := model_problem(name)) is not None:
                raise JobFileError(
                    f"{problem} (the model of {file}'s {', '.join(named)}, or --model)"
                )
        disk.update(knobs.disk_fields(tuple(jobs_of)))  # the cap follows the largest model
        untold.append(disk_cache_line(disk))
        if replicas is not None and (problem := replicas_problem(replicas)) is not None:
            raise JobFileError(problem)
        if (replicas or 1) > 1 and len(jobs_of) > 1:  # the replicas end with their model
            raise JobFileError(
                f"--replicas runs one model, and the jobs of {file} name {len(jobs_of)}; run "
                "each model's jobs on their own (--job NAME ...)"
            )
        return run_jobs(job_file, options, reporter, load_engine, close_engine)
    except JobFileError as exc:
        _fail(headless, str(exc))
    except KeyboardInterrupt:
        _fail(headless, "interrupted before any request ran; nothing was lost", EXIT_INTERRUPTED)
    except Exception as exc:  # an engine or disk failure mid-run: say so without a traceback
        again = resume_command(
            file, model, jobs, output_dir, engine_options, headless, options.max_in_flight
        )
        _fail(
            headless,
            f"the run stopped: {type(exc).__name__}: {exc}\nEvery line finished before the stop "
            f"is saved; run the same command again to resume: {again}",
        )


def run_fits(name: str, kv_start_mib: float) -> str | None:
    """The memory guard before a job's model loads (docs/models.md): why it does not fit in the
    memory free now (None: it does, or its size is not known before it downloads)."""
    from macbatch.engine import resolve_model_path
    from macbatch.models.memory import need_of, refusal_now

    try:
        where = resolve_model_path(name)
    except ValueError:
        return None  # the load says why
    if not isinstance(where, Path):
        return None
    # one job model is loaded at a time: no other of macbatch's to unload
    return refusal_now(name, need_of(where, kv_start_mib), unload="")


def close_engine(engine: Any) -> None:
    """A model's jobs are done: its disk tier writes what it holds."""
    engine.close()


def hand_back_memory() -> None:
    """Before the next model's guard and load: the engines the runner dropped are collected and
    MLX's cached buffers go back to the system, so the memory free counts them."""
    import gc

    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _fail(headless: bool, message: str, code: int = 1) -> NoReturn:
    if headless:
        sys.stderr.write(json.dumps({"event": "error", "message": message}) + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)
