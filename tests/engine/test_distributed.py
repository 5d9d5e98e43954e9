"""Tensor parallelism: two ranks on 127.0.0.1 over MLX's ring backend, started the way users start
them (``mlx.launch``, or MLX_RANK + a hostfile), against mlx-lm's own single-process generation.
Every subprocess has a deadline, so nothing here can hang CI."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

import mlx_lm
import numpy as np
import pytest

from macbatch.batch.runner import LEDGER_NAME
from macbatch.engine import UnsupportedModelError
from macbatch.engine.batch import pack
from macbatch.engine.distributed.channel import decode_batch, encode_batch
from macbatch.engine.distributed.sharding import shard_model
from macbatch.engine.distributed.watchdog import EXIT_PEER_TIMEOUT
from macbatch.engine.kv_cache import BlockPool
from macbatch.engine.request import Request, RequestMetrics
from macbatch.engine.sampling import SamplingParams
from macbatch.engine.scheduler import Scheduler
from tests.support.oracle import mlx_lm_greedy_logprobs
from tests.support.ranks import mlx_launch, spawn_ranks, stop_all
from tests.support.tiny import build_model, save_model
from tests.support.tp_worker import CONFIG, GREEDY, workload_prompts

ROWS = 24


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_two_ranks_generate_what_mlx_lm_generates(arch: str, tmp_path: Path) -> None:
    """Under `mlx.launch -n 2 --backend ring`, with prompts longer than a step's budget (chunked
    prefill), a pool too small for all of them (preemption) and a shared prefix (prefix cache):
    every greedy token, and its log-probability, is mlx-lm's on the whole model."""
    model_dir = save_model(tmp_path / arch, arch=arch, seed=1)
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.support.tp_worker", str(model_dir), str(out)]
    launched = mlx_launch(command, ranks=2, timeout_s=180)
    assert out.exists(), launched.stdout + launched.stderr
    result = json.loads(out.read_text())

    prompts = workload_prompts()
    assert max(map(len, prompts)) > CONFIG.max_num_batched_tokens
    assert result["preemptions"] > 0 and result["prefix_cache_hit_rate"] > 0
    assert result["kv_heads_per_rank"] == [1, 1]  # each rank pages its half of the 2 KV heads
    model, _ = mlx_lm.load(str(model_dir))
    for i, prompt in enumerate(prompts):
        expected = mlx_lm_greedy_logprobs(model, prompt, GREEDY.max_tokens)
        assert result["tokens"][i] == [t for t, _ in expected], f"request {i}"
        np.testing.assert_allclose(result["logprobs"][i], [lp for _, lp in expected], atol=1e-4)


def test_a_step_round_trips_through_its_wire_encoding(tiny_tokenizer) -> None:
    """What the followers decode is exactly the batch rank 0 packed."""
    pool = BlockPool(32)
    scheduler = Scheduler(pool, 8, 40, 8, prefix_root=None)
    for i, length in enumerate([3, 30, 17]):
        scheduler.add(
            Request(
                request_id=str(i),
                prompt_token_ids=list(range(5, 5 + length)),
                params=SamplingParams(max_tokens=4),
                seed=0,
                eos_token_ids=frozenset(),
                detokenizer=tiny_tokenizer.detokenizer,
                metrics=RequestMetrics(arrival_time=0.0, prompt_tokens=length),
            )
        )
    batch = pack(scheduler.schedule(), 8, {1, 2})
    decoded = decode_batch(encode_batch(batch))
    assert decoded.num_tokens == batch.num_tokens == 40
    for name in ("token_ids", "positions", "cu_seqlens_q", "seq_lens", "block_tables"):
        assert getattr(decoded, name).tolist() == getattr(batch, name).tolist(), name
    assert decoded.sample_rows.tolist() == batch.sample_rows.tolist()
    assert {k: v.tolist() for k, v in decoded.kv_write_rows.items()} == {
        k: v.tolist() for k, v in batch.kv_write_rows.items()
    }


class _TwoRanks:
    """Stands in for a group of two when only the group's size is read (no collective runs)."""

    def size(self) -> int:
        return 2


def test_models_that_cannot_be_split_are_refused_with_the_reason() -> None:
    with pytest.raises(
        UnsupportedModelError, match="gemma3_text.*Architectures that have it:.*llama"
    ):
        shard_model(build_model("gemma3_text"), _TwoRanks())
    with pytest.raises(UnsupportedModelError, match="3 key value heads.*divides 3"):
        shard_model(build_model("llama", num_key_value_heads=3, num_attention_heads=6), _TwoRanks())


@pytest.fixture
def rows_job(tmp_path: Path, tiny_model_path: Path) -> Path:
    with (tmp_path / "rows.jsonl").open("w") as f:
        for i in range(ROWS):
            f.write(json.dumps({"id": f"r{i}", "text": f"row {i}: the quick brown fox"}) + "\n")
    job = tmp_path / "jobs.yaml"
    job.write_text(
        f"model: {tiny_model_path}\n"
        "jobs:\n"
        "  - name: rows\n"
        "    input: rows.jsonl\n"
        '    template: "Summarize: {text}"\n'
        "    sampling: {temperature: 0, max_tokens: 8, ignore_eos: true}\n"
    )
    return job


def _run_command(job: Path) -> list[str]:
    return [sys.executable, "-m", "macbatch", "run", str(job), "--headless", "--max-in-flight", "2"]


@pytest.mark.parametrize(
    ("how", "status", "message"),
    [
        (signal.SIGKILL, 1, "connection to a peer was lost"),
        (signal.SIGSTOP, EXIT_PEER_TIMEOUT, "another rank stopped answering"),
    ],
    ids=["rank-killed", "rank-frozen"],
)
def test_a_lost_rank_stops_rank_zero_and_the_run_resumes(
    how: signal.Signals, status: int, message: str, rows_job: Path, monkeypatch
) -> None:
    """Rank 1 is killed (its sockets close) or frozen (a host that stops answering) mid-job: rank
    0 exits within seconds with a clear error instead of hanging, and the same command on two
    ranks resumes from the ledger with every row written exactly once."""
    monkeypatch.setenv("MACBATCH_PEER_TIMEOUT", "3")
    output = rows_job.parent / "out" / "rows.jsonl"
    ranks = spawn_ranks(_run_command(rows_job), 2, rows_job.parent)
    try:
        deadline = time.monotonic() + 120
        while not (output.exists() and output.read_bytes().count(b"\n") >= 4):
            assert time.monotonic() < deadline and ranks[0].poll() is None, ranks[0].stderr.read()
            time.sleep(0.05)
        ranks[1].send_signal(how)
        lost_at = time.monotonic()
        _, stderr = ranks[0].communicate(timeout=30)
        waited = time.monotonic() - lost_at
    finally:
        stop_all(ranks)
    assert ranks[0].returncode == status, stderr.decode()
    assert message in stderr.decode()
    assert waited < 10
    written = output.read_bytes().count(b"\n")
    assert 4 <= written < ROWS

    resumed = mlx_launch(_run_command(rows_job), ranks=2, timeout_s=180)
    summary = json.loads((rows_job.parent / "out" / "summary.json").read_text())
    assert summary["skipped"] >= written and summary["skipped"] + summary["ok"] == ROWS, (
        resumed.stderr
    )
    lines = [json.loads(line) for line in output.read_bytes().splitlines()]
    assert Counter(x["custom_id"] for x in lines) == {f"r{i}": 1 for i in range(ROWS)}
    with sqlite3.connect(rows_job.parent / "out" / LEDGER_NAME) as db:
        assert db.execute("SELECT COUNT(*) FROM done WHERE job='rows'").fetchone() == (ROWS,)
