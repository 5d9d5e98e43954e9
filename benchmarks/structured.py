"""Structured output's cost: the throughput workload with every request schema-constrained vs
none, same process, same model; plus the mask time per step (llguidance filling the bitmasks
while the forward runs, and applying them) at 8 and at 32 rows.

Qwen3's real tokenizer (151,669 tokens, the model's vocabulary 151,936) from
tests/support/tokenizers/qwen3 (read as data), the benchmarks' random Qwen3-shaped model with
that vocabulary. The schema is an open-ended array of objects, so constrained requests stay
inside a grammar for all their tokens.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.structured [--requests 32] [--max-tokens 64]
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from benchmarks.common import build_bench_model, warn_without_openblas, workload_arguments
from macbatch.bench import run_workload, synthetic_prompts
from macbatch.engine import Engine, EngineConfig, StructuredOutput
from macbatch.engine.constraints import ConstraintState

QWEN3 = Path(__file__).resolve().parents[1] / "tests" / "support" / "tokenizers" / "qwen3"
VOCAB = 151936
SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
        },
        "required": ["name", "score"],
    },
}


def engine_for(model, tokenizer, prompts, max_tokens, budget) -> Engine:
    total = sum(len(p) for p in prompts) + max_tokens * len(prompts)
    config = EngineConfig(
        num_blocks=total // 16 + 2 * len(prompts),
        max_num_batched_tokens=budget,
        max_num_seqs=len(prompts),
    )
    return Engine(model, tokenizer, config)


def mask_ms(engine: Engine, rows: int, steps: int = 20) -> tuple[float, float]:
    """(fill, fill + apply) milliseconds per step for ``rows`` matchers mid-way through JSON."""
    compiler = engine.constraints
    spec = StructuredOutput(json_schema=SCHEMA)
    states = []
    prefix = engine.tokenizer.encode('[{"name": "ab', add_special_tokens=False)
    for _ in range(rows):
        state = ConstraintState(compiler.compile(spec))
        assert state.matcher.consume_tokens(prefix)
        states.append(state)
    logits = mx.random.normal((rows, VOCAB))
    mx.eval(logits)
    fill = total = 0.0
    for _ in range(steps):
        before = compiler.mask_seconds
        t = time.perf_counter()
        out = compiler.mask_logits(logits, states, [len(prefix)] * rows)
        mx.eval(out)
        total += time.perf_counter() - t
        fill += compiler.mask_seconds - before
    return 1000 * fill / steps, 1000 * total / steps


def main() -> None:
    args = workload_arguments(__doc__.splitlines()[0]).parse_args()
    warn_without_openblas()
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(QWEN3)
    model = build_bench_model(vocab_size=VOCAB)
    prompts = synthetic_prompts(args.requests, args.min_prompt, args.max_prompt, 151000)
    spec = StructuredOutput(json_schema=SCHEMA)
    results = {}
    for name, structured in (("warmup", spec), ("none", None), ("schema", spec)):
        engine = engine_for(model, tokenizer, prompts, args.max_tokens, args.budget)
        result = run_workload(engine, prompts, args.max_tokens, structured)
        results[name] = (result, engine)
    plain, _ = results["none"]
    constrained, engine = results["schema"]
    print(
        f"{len(prompts)} requests, {plain.prompt_tokens} prompt tokens, {args.max_tokens} new "
        f"each; Qwen3 tokenizer, vocab {VOCAB}"
    )
    for clock, kind in ((0, "wall"), (1, "cpu")):
        for name, result in (("none", plain), ("schema", constrained)):
            print(
                f"{name:7s} {kind:4s} {result.elapsed[clock]:6.1f} s  "
                f"total {result.total_tokens_per_s(clock):7.1f} tok/s  "
                f"generated {result.generated_tokens_per_s(clock):6.1f} tok/s"
            )
        ratio = constrained.total_tokens_per_s(clock) / plain.total_tokens_per_s(clock)
        print(
            f"ratio   {kind:4s} schema/none throughput x{ratio:.3f} ({100 * (1 - ratio):.1f}% loss)"
        )
    compiler = engine.constraints
    print(
        f"in the run: {1000 * compiler.mask_seconds / max(compiler.mask_steps, 1):.2f} ms of mask "
        f"fill per step over {compiler.mask_steps} steps with {args.requests} constrained rows"
    )
    for rows in (8, 32):
        fill, total = mask_ms(engine, rows)
        print(f"mask    {rows:2d} rows: fill {fill:.2f} ms, fill + apply {total:.2f} ms per step")
    print(f"(apply is {np.round(total - fill, 2)} ms of MLX ops on [{rows}, {VOCAB}] logits)")


if __name__ == "__main__":
    main()
