"""Benchmark: a 1,000-prompt job through `macbatch run` versus mlx-lm's `batch_generate`.

Both sides get the same model (random weights, saved to disk in Hugging Face layout), the same
chat-templated prompts, greedy decoding, the same token limit and the same batch width. The
macbatch side is the real job runner (input file, output file, ledger), timed from the first
admitted request to the summary, without model loading; the mlx-lm side is one `batch_generate`
call, also without loading.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        python benchmarks/batch_job.py [--prompts 1000] [--max-tokens 32] [--batch 64]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.tiny import save_model  # noqa: E402

MODEL_SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=4,
    intermediate_size=768,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
)


def make_prompts(count: int, seed: int = 0) -> list[str]:
    """Questions of varied length (8 to 64 words)."""
    rng = random.Random(seed)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "MLX",
        "batches",
        "many",
        "prompts",
    ]
    return [
        f"Question {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(8, 64)))
        for i in range(count)
    ]


def run_macbatch(model: Path, prompts: list[str], work: Path, args: argparse.Namespace) -> dict:
    from macbatch.batch.report import HeadlessReporter
    from macbatch.batch.runner import RunOptions, run_jobs
    from macbatch.batch.spec import load_job_file
    from macbatch.engine import Engine, EngineConfig

    with (work / "prompts.jsonl").open("w") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"id": f"p{i}", "prompt": prompt}) + "\n")
    (work / "bench.yaml").write_text(
        textwrap.dedent(
            f"""
            model: {model}
            output: {{dir: out}}
            jobs:
              - name: bench
                input: prompts.jsonl
                sampling: {{temperature: 0, max_tokens: {args.max_tokens}}}
            """
        )
    )
    config = EngineConfig(max_num_seqs=args.batch)
    summary = run_jobs(
        load_job_file(work / "bench.yaml"),
        RunOptions(fresh=True, max_in_flight=args.batch * 4),
        HeadlessReporter(interval_s=3600, stream=io.StringIO()),
        lambda name: Engine.load(name, config),
    )
    return {
        "requests": summary["ok"],
        "generated_tokens": summary["generated_tokens"],
        "seconds": summary["wall_s"],
    }


def run_mlx_lm(model: Path, prompts: list[str], args: argparse.Namespace) -> dict:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import batch_generate

    lm, tokenizer = mlx_lm.load(str(model))
    lm.set_dtype(mx.float32)  # what the engine runs on CPU
    tokens = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        for p in prompts
    ]
    start = time.perf_counter()
    result = batch_generate(
        lm,
        tokenizer,
        tokens,
        max_tokens=args.max_tokens,
        return_token_ids=True,
        completion_batch_size=args.batch,
    )
    seconds = time.perf_counter() - start
    return {
        "requests": len(result.texts),
        "generated_tokens": sum(len(ids) for ids in result.token_ids),
        "seconds": seconds,
    }


def report(name: str, r: dict) -> tuple[float, float]:
    req_s, tok_s = r["requests"] / r["seconds"], r["generated_tokens"] / r["seconds"]
    print(
        f"{name:<22} {r['requests']:>6} requests {r['generated_tokens']:>8} tokens "
        f"{r['seconds']:>8.2f} s {req_s:>9.2f} req/s {tok_s:>9.1f} generated tok/s"
    )
    return req_s, tok_s


def job_arguments(description: str, prompts: int) -> argparse.Namespace:
    """The options of a benchmark that runs a job of random prompts (this one and batch_api)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="sequences decoded together")
    return parser.parse_args()


def main() -> None:
    args = job_arguments(__doc__, 1000)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = save_model(work / "model", "qwen3", **MODEL_SHAPE)
        prompts = make_prompts(args.prompts)
        print(
            f"{args.prompts} prompts, greedy, max_tokens={args.max_tokens}, batch={args.batch}, "
            f"random qwen3 {MODEL_SHAPE}"
        )
        ours = report("macbatch run", run_macbatch(model, prompts, work, args))
        theirs = report("mlx-lm batch_generate", run_mlx_lm(model, prompts, args))
    print(
        f"ratio macbatch / mlx-lm: {ours[0] / theirs[0]:.2f}x requests/s, "
        f"{ours[1] / theirs[1]:.2f}x generated tok/s"
    )


if __name__ == "__main__":
    main()
