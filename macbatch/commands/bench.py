"""`macbatch bench`: how fast a model is on this machine, on a synthetic workload through the
engine (`workload.py`, which the benchmarks in benchmarks/ share)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import SPECULATIVE, EngineKnobs, resolve_model
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.commands.workload import WorkloadResult

# bench's engine knobs: the step's token budget and speculation
BENCH_KNOBS = Pick(
    EngineKnobs,
    ("max_num_batched_tokens", *SPECULATIVE),
    names={"max_num_batched_tokens": "--budget"},  # its name since bench began
)


@takes(knobs=BENCH_KNOBS)
def bench_command(
    model: str = typer.Option(
        DEFAULT_MODEL, "--model", "-m", help="Model name, short name, preset, path or hub id."
    ),
    requests: int = typer.Option(32, min=1, help="Requests, all arriving at once."),
    min_prompt: int = typer.Option(32, min=1, help="Shortest prompt, in tokens."),
    max_prompt: int = typer.Option(512, min=1, help="Longest prompt, in tokens."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens generated per request (EOS ignored)."),
    embed: bool = typer.Option(
        False, "--embed", help="Embed the prompts (pooling requests) instead of generating."
    ),
    *,
    knobs: EngineKnobs,
) -> None:
    """Measure this model on this machine: random-token prompts through the engine, then total
    and generated tokens/s and the median time to first token (`--embed`: embedding
    throughput, prompt tokens/s and inputs/s)."""
    from macbatch.commands.workload import run_pooling_workload, run_workload, synthetic_prompts
    from macbatch.engine import Engine, EngineConfig

    if min_prompt > max_prompt:
        raise typer.BadParameter("--min-prompt must not exceed --max-prompt")
    model = resolve_model(model, check=False).model  # the load says why one cannot load
    config = EngineConfig(
        max_num_batched_tokens=knobs.max_num_batched_tokens, **knobs.speculative_fields()
    )
    typer.echo(f"loading {model} ...")
    try:
        engine = Engine.load(model, config)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    prompts = synthetic_prompts(requests, min_prompt, max_prompt, engine.info.model.vocab_size)
    if embed:
        typer.echo(f"{requests} inputs to embed, {sum(map(len, prompts)):,} tokens")
        result, _ = run_pooling_workload(engine, prompts)
    else:
        typer.echo(
            f"{requests} requests, {sum(map(len, prompts)):,} prompt tokens, {max_tokens} new"
        )
        result = run_workload(engine, prompts, max_tokens)
    if result.failures:
        typer.echo(
            f"{len(result.failures)} of {requests} requests failed; first: {result.failures[0]}",
            err=True,
        )
    if not result.succeeded:
        typer.echo("error: no request succeeded, so there is nothing to measure", err=True)
        raise typer.Exit(1)
    typer.echo(_rates(result, embed))
    counts = engine.stats().speculation
    if counts.verifications:
        typer.echo(
            f"speculative: {counts.acceptance_rate:.0%} of {counts.drafted:,} drafted tokens "
            f"accepted, {counts.mean_accepted_length:.2f} tokens per verification"
        )


def _rates(result: WorkloadResult, embed: bool) -> str:
    """What ``bench`` measured, in one line."""
    wall, steps = result.elapsed[0], len(result.step_tokens)
    if embed:
        return (
            f"{wall:.1f} s: {result.prompt_tokens / wall:,.1f} tok/s embedded, "
            f"{result.succeeded / wall:,.1f} inputs/s, {steps} engine steps"
        )
    return (
        f"{wall:.1f} s: {result.total_tokens_per_s():,.1f} total tok/s, "
        f"{result.generated_tokens_per_s():,.1f} generated tok/s, median time to first token "
        f"{result.median_ttft() * 1000:,.0f} ms, {steps} engine steps"
    )
