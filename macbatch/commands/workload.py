"""A synthetic workload through the engine: how fast is this model on this machine?

Used by `macbatch bench` and by the benchmarks in benchmarks/, which add mlx-lm as the peer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from macbatch.engine import Engine, PoolingParams, RequestOutput, SamplingParams, StructuredOutput


def synthetic_prompts(
    count: int, shortest: int, longest: int, vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """Random token prompts with lengths uniform in [shortest, longest] (seeded)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, size=count)
    return [rng.integers(10, vocab_size, size=int(n)).tolist() for n in lengths]


class Clock:
    """Wall time and this process's CPU time since creation. CPU time is what to compare on a
    shared machine: other processes stretch wall time, not the CPU work a run needs."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


@dataclass
class WorkloadResult:
    prompt_tokens: int
    generated_tokens: int
    elapsed: tuple[float, float]  # (wall, cpu) seconds
    first_token: list[tuple[float, float]]  # per request, (wall, cpu) seconds since the start
    step_tokens: list[int] = field(default_factory=list)
    first_token_step: list[int] = field(default_factory=list)  # per request, the step's index
    failures: list[str] = field(default_factory=list)  # why each failed request failed

    @property
    def succeeded(self) -> int:
        return len(self.first_token)

    def total_tokens_per_s(self, clock: int = 0) -> float:
        return (self.prompt_tokens + self.generated_tokens) / self.elapsed[clock]

    def generated_tokens_per_s(self, clock: int = 0) -> float:
        return self.generated_tokens / self.elapsed[clock]

    def median_ttft(self, clock: int = 0) -> float:
        return statistics.median(t[clock] for t in self.first_token)


def run_workload(
    engine: Engine,
    prompts: list[list[int]],
    max_tokens: int,
    structured: StructuredOutput | None = None,
) -> WorkloadResult:
    """All prompts arrive at once; greedy, EOS ignored, so every request makes max_tokens
    (``structured``: every request follows this constraint)."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True, structured=structured
    )
    first: dict[str, tuple[float, float]] = {}
    first_step: dict[str, int] = {}
    generated = 0
    step_tokens: list[int] = []
    failures: list[str] = []
    ran: list[list[int]] = []
    clock = Clock()
    for prompt in prompts:
        try:
            engine.add_request(prompt, params)
            ran.append(prompt)
        except ValueError as exc:  # a prompt that does not fit: counted, not timed
            failures.append(str(exc))
    while engine.has_unfinished():
        outputs = engine.step()
        now = clock.read()
        for out in outputs:
            if out.error is not None:
                failures.append(out.error)
                continue
            first.setdefault(out.request_id, now)
            first_step.setdefault(out.request_id, len(step_tokens))
            generated += len(out.new_token_ids)
        step_tokens.append(engine.stats().tokens_last_step)
    return WorkloadResult(
        failures=failures,
        prompt_tokens=sum(len(p) for p in ran),
        generated_tokens=generated,
        elapsed=clock.read(),
        first_token=list(first.values()),
        step_tokens=step_tokens,
        first_token_step=list(first_step.values()),
    )


def run_pooling_workload(
    engine: Engine, prompts: list[list[int]], pooling: PoolingParams | None = None
) -> tuple[WorkloadResult, list[np.ndarray]]:
    """All prompts arrive at once as pooling requests (embeddings); returns the timing (no
    tokens generated: prompt tokens are the throughput; ``first_token`` holds each vector's
    time) and the vectors in prompt order. A prompt that does not fit is counted, not timed."""
    clock = Clock()
    failures: list[str] = []
    order: list[str] = []
    for prompt in prompts:
        try:
            order.append(engine.add_request(prompt, pooling or PoolingParams()))
        except ValueError as exc:
            failures.append(str(exc))
    done: dict[str, RequestOutput] = {}
    step_tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        step_tokens.append(engine.stats().tokens_last_step)
    finals = [done[rid] for rid in order]
    failures += [o.error or "no vector" for o in finals if o.embedding is None]
    ok = [o for o in finals if o.embedding is not None]
    elapsed = clock.read()
    tokens = sum(o.metrics.prompt_tokens for o in ok)
    result = WorkloadResult(tokens, 0, elapsed, [elapsed] * len(ok), step_tokens, [], failures)
    return result, [o.embedding for o in ok]
