"""Benchmark: the same prompts as a Batch API batch in `macbatch serve` versus `macbatch run`.

Same model (random weights), same chat prompts, greedy, same token limit, same engine width.
`macbatch run` is timed by its summary (first admitted request to the end, without loading);
the batch from its creation to `completed` (the server's batch thread feeding its engine thread,
the file store and finalizing included; no HTTP, which carries only the upload and the polls).
The batch runs twice: with the default live-first cap (half the sequences) and allowed every
sequence (`--batch-max-in-flight` = the width), to show what leaving room for live requests
costs when there are none.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        python benchmarks/batch_api.py [--prompts 500] [--max-tokens 32] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_job import (  # noqa: E402
    MODEL_SHAPE,
    job_arguments,
    make_prompts,
    report,
    run_macbatch,
)
from tests.support.tiny import save_model  # noqa: E402

CHAT = "/v1/chat/completions"


def run_batch_api(
    model: Path, prompts: list[str], work: Path, args: argparse.Namespace, in_flight: int | None
) -> dict:
    from macbatch.engine import Engine, EngineConfig, EngineThread
    from macbatch.server.app import ServerOptions, create_app, stop_batches
    from macbatch.server.batchapi.inputs import count_requests

    config = EngineConfig(max_num_seqs=args.batch)
    thread = EngineThread(lambda: Engine.load(str(model), config)).start()
    thread.wait_ready()
    options = ServerOptions(data_dir=work / f"serve-{in_flight}", batch_max_in_flight=in_flight)
    app = create_app(thread, thread.tokenizer, options)
    api = app.state.macbatch.batch_api
    rows = work / "rows.jsonl"
    with rows.open("w") as f:
        for i, prompt in enumerate(prompts):
            body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                    "max_tokens": args.max_tokens}  # fmt: skip
            f.write(json.dumps({"custom_id": f"p{i}", "url": CHAT, "body": body}) + "\n")
    with rows.open("rb") as f:
        upload = api.files.save(f, "rows.jsonl", "batch", 1 << 40)
    total = count_requests(api.files.content_path(upload["id"]), CHAT, str(model))
    start = time.perf_counter()
    fields = {"endpoint": CHAT, "input_file_id": upload["id"], "completion_window": "24h"}
    batch = api.batches.create(fields, total)
    api.worker.wake()
    while (batch := api.batches.get(batch["id"]))["status"] != "completed":
        time.sleep(0.005)
    seconds = time.perf_counter() - start
    lines = api.files.content_path(batch["output_file_id"]).read_text().splitlines()
    stop_batches(app)
    thread.shutdown()
    tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in lines)
    return {"requests": len(lines), "generated_tokens": tokens, "seconds": seconds}


def main() -> None:
    args = job_arguments(__doc__, 500)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = save_model(work / "model", "qwen3", **MODEL_SHAPE)
        prompts = make_prompts(args.prompts)
        print(
            f"{args.prompts} prompts, greedy, max_tokens={args.max_tokens}, batch={args.batch}, "
            f"random qwen3 {MODEL_SHAPE}"
        )
        run = report("macbatch run", run_macbatch(model, prompts, work, args))
        half = report("Batch API (half)", run_batch_api(model, prompts, work, args, None))
        full = report("Batch API (all seqs)", run_batch_api(model, prompts, work, args, args.batch))
    print(
        f"ratio Batch API / macbatch run: {half[0] / run[0]:.2f}x requests/s with the live-first "
        f"cap, {full[0] / run[0]:.2f}x allowed every sequence"
    )


if __name__ == "__main__":
    main()
