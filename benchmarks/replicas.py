"""Benchmark: a job through `macbatch run` in one process versus two whole-model replicas
(`mlx.launch -n 2 --backend ring -- macbatch run ... --replicas 2`) on the same machine.

The same random-weight model (saved in Hugging Face layout), the same greedy rows, the same
token limit. Each side's numbers come from its own `summary.json`: rows per second over the run's
wall time (from the first row handed out to the summary, model loading excluded), and for the
replicas the rows each one answered and rank 0's hand-out time (`handout_s`: preparing the
hand-out, pickling, taking outputs back, and the exchange thread's CPU time in rounds that carried
messages) as a share of the wall time and per row. The replies of both runs are compared too.

On one machine two replicas share its cores (and here its load): the ratio says what a second
Mac would add only where cores are idle. Run it once; it prints the load average around it.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.replicas [--rows 400] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.batch_job import MODEL_SHAPE
from tests.support.ranks import REPO, mlx_launch
from tests.support.rows_job import write_rows_job
from tests.support.tiny import save_model


def run_command(job: Path, out: Path, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "macbatch", "run", str(job), "--headless", "-o", str(out)]
    return command + list(extra) + ["--no-disk-cache"]


def replies(out: Path) -> dict[str, str]:
    lines = [json.loads(raw) for raw in (out / "rows.jsonl").read_text().splitlines()]
    return {
        x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in lines
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = save_model(work / "model", arch="qwen3", **MODEL_SHAPE)
        job = write_rows_job(work, model, args.rows, args.max_tokens)
        load_before = os.getloadavg()
        one = subprocess.run(
            run_command(job, work / "one"), cwd=REPO, capture_output=True, text=True, timeout=1800
        )
        assert one.returncode == 0, one.stderr[-2000:]
        two = mlx_launch(run_command(job, work / "two", "--replicas", "2"), 2, timeout_s=1800)
        assert (work / "two" / "summary.json").exists(), two.stderr[-2000:]
        load_after = os.getloadavg()
        single = json.loads((work / "one" / "summary.json").read_text())
        double = json.loads((work / "two" / "summary.json").read_text())
        alone, split = replies(work / "one"), replies(work / "two")
        differ = sum(alone[key] != split.get(key) for key in alone)
    rows_per_s = (single["requests_per_s"], double["requests_per_s"])
    handout = double["handout_s"]
    print(f"{args.rows} rows x {args.max_tokens} tokens, greedy; model {MODEL_SHAPE}")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min)")
    print(f"1 process:  {rows_per_s[0]:.2f} rows/s (wall {single['wall_s']:.1f} s)")
    print(f"2 replicas: {rows_per_s[1]:.2f} rows/s (wall {double['wall_s']:.1f} s)")
    print(f"ratio 2 replicas / 1 process: {rows_per_s[1] / rows_per_s[0]:.2f}")
    for replica in double["replicas"]:
        print(f"  replica {json.dumps(replica)}")
    print(
        f"hand-out: {handout:.3f} s on rank 0 = {100 * handout / double['wall_s']:.2f}% of the "
        f"wall time, {1000 * handout / args.rows:.2f} ms per row "
        f"(a row takes {1000 * double['wall_s'] / args.rows:.1f} ms of wall time)"
    )
    # A random-weight model has near-ties that a different batch composition can flip (one
    # process with --max-seqs 16 instead of 64 also differs in a row or so of 400).
    print(f"replies that differ from one process's: {differ} of {args.rows}")


if __name__ == "__main__":
    main()
