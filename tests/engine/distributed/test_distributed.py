"""Tensor parallelism: two ranks on 127.0.0.1 over MLX's ring backend, started the way users start
them (``mlx.launch``, or MLX_RANK + a hostfile), against mlx-lm's own single-process generation.
Every subprocess has a deadline, so nothing here can hang CI."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, UnsupportedModelError
from macbatch.engine.core.outputs import RequestMetrics
from macbatch.engine.core.packing import pack
from macbatch.engine.core.request import Request
from macbatch.engine.core.scheduler import Scheduler
from macbatch.engine.distributed.channel import (
    MessageKind,
    PeerLostError,
    StepChannel,
    decode_batch,
    encode_batch,
)
from macbatch.engine.distributed.follower import follow_step
from macbatch.engine.distributed.sharding import shard_model
from macbatch.engine.model.recurrent import StateChunk, StateRows
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.worker.model_runner import ModelRunner
from tests.support.kv import fixed_kv_manager
from tests.support.oracle import mlx_lm_greedy_logprobs
from tests.support.ranks import mlx_launch, ring_hostfile
from tests.support.tiny import build_model, save_model
from tests.support.tp_worker import CONFIG, GREEDY, workload_prompts


@pytest.mark.parametrize(
    ("arch", "overrides", "bits"),
    [
        ("llama", {}, None),
        ("qwen3", {}, None),
        ("qwen3_5", {}, None),
        ("qwen3_5", {"tie_word_embeddings": False}, None),
        ("glm4_moe_lite", {}, None),
        ("deepseek_v3", {}, None),
        ("deepseek_v2", {}, None),
        ("deepseek_v2", {"moe_intermediate_size": 64}, 4),  # whole 32-groups per rank
    ],
)
def test_two_ranks_generate_what_mlx_lm_generates(
    arch: str, overrides: dict, bits: int | None, tmp_path: Path
) -> None:
    """Under `mlx.launch -n 2 --backend ring`, with prompts longer than a step's budget (chunked
    prefill), a pool too small for all of them (preemption) and a shared prefix (prefix cache):
    every greedy token, and its log-probability, is mlx-lm's on the whole model. A hybrid
    (qwen3_5) splits its Gated DeltaNet heads and their state slots too, and with untied
    embeddings mlx-lm splits its LM head by vocabulary (every rank applies it). An MLA model
    (glm4_moe_lite, deepseek_v3, deepseek_v2) splits its query heads and their up-projections
    (DeepSeek V2's ``kv_b_proj`` by rows, a quantized one into quantized shards the engine
    dequantizes per rank), and every rank pages the whole latent (one row per token, shared by
    all heads). ``bits``: the checkpoint converted by mlx-lm to that many bits first."""
    model_dir = save_model(tmp_path / arch, arch=arch, seed=1, **overrides)
    if bits is not None:
        mlx_lm.convert(
            str(model_dir), str(tmp_path / "q"), quantize=True, q_bits=bits, q_group_size=32
        )
        model_dir = tmp_path / "q"
    out = tmp_path / "result.json"
    # without speculation: ``auto`` drafts by prompt lookup now, whose held drafts end the
    # requests before the pool preempts (speculation under mlx.launch has its own tests:
    # tests/engine/speculative/test_distributed.py)
    command = [sys.executable, "-m", "tests.support.tp_worker", str(model_dir), str(out), "off"]
    launched = mlx_launch(command, ranks=2, timeout_s=180)
    assert out.exists(), launched.stdout + launched.stderr
    result = json.loads(out.read_text())
    # the follower builds its runner for rank 0's mode (no snapshot state slots)
    assert "loaded its shard of" in launched.stderr + launched.stdout
    assert "(speculative off)" in launched.stderr + launched.stdout

    prompts = workload_prompts()
    assert max(map(len, prompts)) > CONFIG.max_num_batched_tokens
    assert result["preemptions"] > 0 and result["prefix_cache_hit_rate"] > 0
    # every layer of a rank pages its half of the 2 KV heads, or an MLA layer's whole latent row
    assert set(result["kv_heads_per_rank"]) == {1}
    model, _ = mlx_lm.load(str(model_dir))
    for i, prompt in enumerate(prompts):
        expected = mlx_lm_greedy_logprobs(model, prompt, GREEDY.max_tokens)
        assert result["tokens"][i] == [t for t, _ in expected], f"request {i}"
        np.testing.assert_allclose(result["logprobs"][i], [lp for _, lp in expected], atol=1e-4)


def _packed_step(tiny_tokenizer):
    """A prefill step of three requests, 40 tokens."""
    kv = fixed_kv_manager(32, 8, prefix_root=None)
    scheduler = Scheduler(kv, 40, 8)
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
    plan = scheduler.schedule()
    tables = [kv.block_table(c.request.request_id) for c in plan.chunks]
    return pack(plan, tables, 8, {1, 2})


def test_a_step_round_trips_through_its_wire_encoding(tiny_tokenizer) -> None:
    """What the followers decode is exactly the batch rank 0 packed."""
    batch = _packed_step(tiny_tokenizer)
    batch.reads_hidden = 1  # rank 0 reads the hidden states (an MTP layer's): so must they
    decoded = decode_batch(encode_batch(batch))
    assert decoded.reads_hidden == 1
    assert decoded.num_tokens == batch.num_tokens == 40
    for name in ("token_ids", "positions", "cu_seqlens_q", "seq_lens", "block_tables"):
        assert getattr(decoded, name).tolist() == getattr(batch, name).tolist(), name
    assert decoded.sample_rows.tolist() == batch.sample_rows.tolist()
    assert (decoded.pending_rows, decoded.pending_chunks) == (batch.pending_rows, [])
    assert {k: v.tolist() for k, v in decoded.kv_write_rows.items()} == {
        k: v.tolist() for k, v in batch.kv_write_rows.items()
    }


def test_a_hybrid_steps_state_rows_round_trip(tiny_tokenizer) -> None:
    """A hybrid model's state rows (which rows form which sequence, from and to which slots and
    checkpoints) reach the followers as rank 0 built them."""
    plans = [StateChunk(-1, 0), StateChunk(2, 1, checkpoint=9, checkpoint_at=8), StateChunk(3, 3)]
    rows = StateRows.build(np.array([3, 30, 1]), plans)
    batch = dataclasses.replace(_packed_step(tiny_tokenizer), state_rows=rows)
    decoded = decode_batch(encode_batch(batch)).state_rows
    assert decoded is not None and np.array_equal(decoded.wire, rows.wire)
    assert [b.chunks for b in decoded.batches] == [b.chunks for b in rows.batches]
    for name in ("single_reads", "write_slots", "write_stretches"):
        assert getattr(decoded, name) == getattr(rows, name), name
    assert decoded.write_slots == (3, 0, 1, 9)


def test_a_step_lost_in_sending_leaves_no_step_in_flight(tiny_tokenizer, monkeypatch) -> None:
    """A broadcast that fails (a rank died) raises PeerLostError and leaves the channel as if no
    step had started: the watchdog disarmed (else it would end the process during the caller's
    cleanup) and the stop still sent at exit."""
    channel = StepChannel(mx.distributed.init())
    sent: list[int] = []

    def broadcast(values: np.ndarray) -> np.ndarray:
        sent.append(int(values[0]))
        if values[0] == MessageKind.STEP:
            raise RuntimeError("connection reset by peer")
        return values

    monkeypatch.setattr(channel, "_broadcast", broadcast)
    with pytest.raises(PeerLostError, match="lost a rank"):
        channel.send_step(_packed_step(tiny_tokenizer))
    assert channel.watchdog._started is None
    channel.send_stop()
    assert sent == [MessageKind.STEP, MessageKind.STOP]


def test_a_follower_step_writes_rank_zero_k_v_without_the_lm_head(
    tiny_tokenizer, monkeypatch
) -> None:
    """A follower runs every layer of the step (so every collective, in rank 0's order) and
    writes the same K/V as rank 0's full forward, but never computes logits: only rank 0
    samples, and the head is not split."""
    batch = _packed_step(tiny_tokenizer)
    config = EngineConfig(num_blocks=32, block_size=8)
    rank0 = Engine(build_model("llama", seed=3), tiny_tokenizer, config)
    logits = rank0.runner.adapter.forward(batch, rank0.runner.kv_stores)
    mx.eval(logits, *rank0.runner.store.arrays())
    assert logits.shape[0] == batch.sample_rows.size > 0

    follower = ModelRunner(build_model("llama", seed=3), config)  # no tokenizer, no engine

    def no_head(*args, **kwargs):
        raise AssertionError("a follower computed the LM head")

    monkeypatch.setattr(type(follower.adapter.model), "__call__", no_head)
    follow_step(follower, batch)
    for ours, own in zip(rank0.runner.store.arrays(), follower.store.arrays()):
        assert mx.array_equal(ours, own).item()
    assert any(mx.abs(a).max().item() > 0 for a in follower.store.arrays())


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
    with pytest.raises(UnsupportedModelError, match="3 linear key heads, which 2 ranks"):
        hybrid = build_model("qwen3_5", linear_num_key_heads=3, linear_num_value_heads=6)
        shard_model(hybrid, _TwoRanks())
    with pytest.raises(UnsupportedModelError, match="nemotron_h.*no tensor-parallel sharding"):
        shard_model(build_model("nemotron_h"), _TwoRanks())


def _doctor_as_rank_zero(hostfile: Path, **env: str) -> subprocess.CompletedProcess:
    """`macbatch doctor` started as rank 0 of the ring ``hostfile`` (no other rank started)."""
    return subprocess.run(
        [sys.executable, "-m", "macbatch", "doctor"],
        env=dict(os.environ, MLX_RANK="0", MLX_HOSTFILE=str(hostfile), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_launch_with_one_rank_runs_alone(tmp_path: Path) -> None:
    """`mlx.launch` on one host sets MLX_RANK and an empty ring hostfile: no group to join."""
    empty = tmp_path / "hosts.json"
    empty.write_text("")
    alone = _doctor_as_rank_zero(empty)
    assert alone.returncode == 0, alone.stderr
    assert "attention" in alone.stdout


def test_a_rank_that_never_connects_stops_rank_zero(tmp_path: Path) -> None:
    """A host in the hostfile that is down: rank 0 stops with a clear error instead of waiting
    forever in MLX's connect (3 x MACBATCH_PEER_TIMEOUT)."""
    started = time.monotonic()
    lonely = _doctor_as_rank_zero(ring_hostfile(tmp_path, 2), MACBATCH_PEER_TIMEOUT="1")
    assert lonely.returncode == -signal.SIGKILL, lonely.stderr
    assert "connecting to the other ranks made no progress for 3 s" in lonely.stderr
    assert time.monotonic() - started < 30


def test_step_deadlines_follow_the_steps_seen(monkeypatch) -> None:
    """Warm-up steps get a minute; then ten times the tighter of the slowest seconds-per-token
    times the step's tokens and the slowest step (scaled when this one is bigger than any seen),
    never under the floor."""
    from macbatch.engine.distributed import watchdog as module

    clock = [0.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    dog = module.Watchdog(floor_s=2.0, who="test")

    def step(tokens: int, seconds: float) -> None:
        dog.arm("step", tokens)
        clock[0] += seconds
        dog.disarm()

    for _ in range(module.WARMUP_STEPS):
        assert dog.deadline_s(2) == pytest.approx(module.WARMUP_TIMEOUT_S)
        step(2, 1.0)  # 0.5 s per token, 1 s per step
    assert dog.deadline_s(2) == pytest.approx(10 * min(0.5 * 2, 1.0))
    assert dog.deadline_s(12) == pytest.approx(10 * min(0.5 * 12, 1.0 * 12 / 2))
    step(12, 1.2)  # a bigger step: 1.2 s per step, 0.1 s per token
    assert dog.deadline_s(12) == pytest.approx(10 * min(0.5 * 12, 1.2))
    assert dog.deadline_s(24) == pytest.approx(10 * min(0.5 * 24, 1.2 * 24 / 12))
    assert dog.deadline_s(1) == pytest.approx(max(2.0, 10 * min(0.5, 1.2)))
