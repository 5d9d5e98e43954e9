"""Structured output's cost: the throughput workload with every request schema-constrained vs
none, same process, same model; plus the mask time per step (llguidance filling the bitmasks
while the forward runs, and applying them) at 8 and at 32 rows.

Qwen3's real tokenizer (151,669 tokens, the model's vocabulary 151,936) from
tests/support/tokenizers/qwen3 (read as data), the benchmarks' random Qwen3-shaped model with
that vocabulary. The schema is an open-ended array of objects, so constrained requests stay
inside a grammar for all their tokens.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.structured [--requests 32] [--max-tokens 64] [--repeat 3]
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from benchmarks.common import build_bench_model, warn_without_openblas, workload_arguments
from macbatch.commands.workload import run_workload, synthetic_prompts
from macbatch.engine import Engine, EngineConfig, StructuredOutput
from macbatch.engine.structured_output.constraints import ConstraintState, apply_bitmask

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


# The same without the bound on names: llguidance fills masks inside a length-bounded string on
# its slow path (every token checked, about 2 ms per row for this vocabulary), elsewhere in
# about 0.05 ms per row.
UNBOUNDED = copy.deepcopy(SCHEMA)
del UNBOUNDED["items"]["properties"]["name"]["maxLength"]

# A reply the schemas allow, long enough for every row to advance one token per measured step.
REPLY = ", ".join(
    f'{{"name": "item{i}", "score": {10 * i}, "tags": ["red", "green"]}}' for i in range(40)
)


def device_expand(logits: mx.array, words: np.ndarray) -> mx.array:
    """The peer for ``apply_bitmask``: the bits expanded on the device (a shift/and per word,
    then a select), as the engine did before."""
    bits = mx.array(words).view(mx.uint32)[:, :, None] >> mx.arange(32, dtype=mx.uint32)
    allowed = (bits & 1).reshape(words.shape[0], -1)[:, : logits.shape[-1]].astype(mx.bool_)
    return mx.where(allowed, logits, -mx.inf)


def mask_ms(engine: Engine, rows: int, schema: dict = SCHEMA, steps: int = 20) -> dict[str, float]:
    """CPU milliseconds per step (this process, every thread: what a shared machine measures
    fairly) for ``rows`` matchers inside a JSON reply, each at its own place and advancing one
    token per step (so every fill computes a new mask): the engine's whole mask step (fill +
    apply), the apply alone (host unpack + one fused select; its cost does not depend on the
    bits), the device-expanded apply it replaced, and the greedy sampling (argmax) that follows
    either way. The fill is the whole minus the apply."""
    compiler = engine.constraints
    spec = StructuredOutput(json_schema=schema)
    reply = engine.tokenizer.encode("[" + REPLY, add_special_tokens=False)
    states = [ConstraintState(compiler.compile(spec)) for _ in range(rows)]
    for i, state in enumerate(states):
        assert state.matcher.consume_tokens(reply[:i])
    logits = mx.random.normal((rows, VOCAB))
    words = np.full((rows, (VOCAB + 31) // 32), -1, dtype=np.int32)
    mx.eval(logits)
    parts = {
        "apply": lambda: apply_bitmask(logits, words),
        "device_expand": lambda: device_expand(logits, words),
        "argmax": lambda: mx.argmax(logits, axis=-1),
    }
    spent = dict.fromkeys(["mask", *parts], 0.0)
    for step in range(steps):
        t = time.process_time()
        mx.eval(compiler.mask_logits(logits, states, [0] * rows))
        spent["mask"] += time.process_time() - t
        for name, part in parts.items():
            t = time.process_time()
            mx.eval(part())
            spent[name] += time.process_time() - t
        for i, state in enumerate(states):
            assert state.matcher.consume_token(reply[i + step])
    ms = {k: 1000 * v / steps for k, v in spent.items()}
    return dict(ms, fill=ms["mask"] - ms["apply"])


def run_arms(args, model, tokenizer, prompts) -> tuple[list[float], Engine]:
    """CPU-time throughput ratios schema/none, one per repeat (the arms alternate, same
    process); and the last constrained engine."""
    spec = StructuredOutput(json_schema=SCHEMA)
    engine = engine_for(model, tokenizer, prompts, args.max_tokens, args.budget)
    run_workload(engine, prompts, args.max_tokens, spec)  # warm-up: tokenizer index, compiles
    ratios = []
    for repeat in range(args.repeat):
        results = {}
        for name, structured in (("none", None), ("schema", spec)):
            engine = engine_for(model, tokenizer, prompts, args.max_tokens, args.budget)
            results[name] = run_workload(engine, prompts, args.max_tokens, structured)
        plain, constrained = results["none"], results["schema"]
        if repeat == 0:
            print(
                f"{len(prompts)} requests, {plain.prompt_tokens} prompt tokens, "
                f"{args.max_tokens} new each; Qwen3 tokenizer, vocab {VOCAB}"
            )
        for clock, kind in ((0, "wall"), (1, "cpu")):
            for name, result in results.items():
                print(
                    f"{name:7s} {kind:4s} {result.elapsed[clock]:6.1f} s  "
                    f"total {result.total_tokens_per_s(clock):7.1f} tok/s  "
                    f"generated {result.generated_tokens_per_s(clock):6.1f} tok/s"
                )
            ratio = constrained.total_tokens_per_s(clock) / plain.total_tokens_per_s(clock)
            print(
                f"ratio   {kind:4s} schema/none throughput x{ratio:.3f} "
                f"({100 * (1 - ratio):.1f}% loss)"
            )
        ratios.append(constrained.total_tokens_per_s(1) / plain.total_tokens_per_s(1))
    return ratios, engine


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of both arms")
    args = parser.parse_args()
    warn_without_openblas()
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(QWEN3)
    model = build_bench_model(vocab_size=VOCAB)
    prompts = synthetic_prompts(args.requests, args.min_prompt, args.max_prompt, 151000)
    ratios, engine = run_arms(args, model, tokenizer, prompts)
    median = statistics.median(ratios)
    print(
        f"median  cpu  schema/none throughput x{median:.3f} ({100 * (1 - median):.1f}% loss) "
        f"over {len(ratios)} runs: " + " ".join(f"x{r:.3f}" for r in ratios)
    )
    compiler = engine.constraints
    print(
        f"in the run: {1000 * compiler.mask_seconds / max(compiler.mask_steps, 1):.2f} ms (wall, "
        f"beside the forward) of mask fill per step over {compiler.mask_steps} steps with "
        f"{args.requests} constrained rows; CPU ms per step:"
    )
    for rows in (8, 32):
        ms = mask_ms(engine, rows)
        print(
            f"mask    {rows:2d} rows: fill {ms['fill']:.2f} + apply {ms['apply']:.2f} = "
            f"{ms['fill'] + ms['apply']:.2f} ms per step (device-expanded apply "
            f"{ms['device_expand']:.2f} ms, x{ms['device_expand'] / ms['apply']:.1f}; "
            f"greedy argmax after it {ms['argmax']:.2f} ms)"
        )
    ms = mask_ms(engine, 8, UNBOUNDED)
    print(
        f"mask     8 rows, names without maxLength: fill {ms['fill']:.2f} + apply "
        f"{ms['apply']:.2f} = {ms['fill'] + ms['apply']:.2f} ms per step"
    )


if __name__ == "__main__":
    main()
