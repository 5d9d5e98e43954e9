"""Shared pieces of the benchmarks: the random Qwen3-shaped model and the prompt workload."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

import mlx.core as mx

BENCH_MODEL = dict(
    model_type="qwen3",
    hidden_size=512,
    num_hidden_layers=8,
    intermediate_size=1536,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=32000,
    rms_norm_eps=1e-6,
    max_position_embeddings=8192,
    rope_theta=1e6,
    tie_word_embeddings=True,
)

# A model whose compute is negligible (overrides of BENCH_MODEL): a step's time is what the host
# does around it, as with a small model on a Mac's GPU (benchmarks/host_overhead.py).
TINY_MODEL = dict(
    hidden_size=64,
    num_hidden_layers=1,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=2048,
)

# Qwen3-0.6B's shape (random weights): what single-stream decode speed is measured on.
QWEN3_0_6B = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    max_position_embeddings=40960,
)

# The same size as a hybrid: Qwen3.5's layout, 3 of every 4 layers Gated DeltaNet.
HYBRID_BENCH_MODEL = dict(
    BENCH_MODEL,
    model_type="qwen3_5",
    linear_num_value_heads=8,
    linear_num_key_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    rope_parameters={
        "type": "default",
        "rope_theta": 1e6,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
    },
)

# Qwen3.5's small hybrid shape (random weights): hidden 1024, 24 layers, 3 of every 4 Gated
# DeltaNet (16 value / 8 key heads of 128), 8/4 attention heads of 128.
QWEN3_5_SHAPE = dict(
    HYBRID_BENCH_MODEL,
    hidden_size=1024,
    num_hidden_layers=24,
    intermediate_size=3072,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    linear_num_value_heads=16,
    linear_num_key_heads=8,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)

# The shapes a benchmark takes by name (``--shape``): overrides of BENCH_MODEL ("bench": the
# 8-layer bench model itself; the others real models' shapes).
SHAPES = {"bench": {}, "qwen3": QWEN3_0_6B, "qwen3_5": QWEN3_5_SHAPE}


def shaped_model(shape: str, layers: int | None, context: int):
    """A random model of ``SHAPES[shape]`` (its own layer count unless ``layers``) with room for
    ``context`` tokens, a tokenizer covering its vocabulary, and the vocabulary's size."""
    overrides = dict(SHAPES[shape])
    if layers is not None:
        overrides["num_hidden_layers"] = layers
    overrides["max_position_embeddings"] = max(context, 8192)
    vocab = overrides.get("vocab_size", BENCH_MODEL["vocab_size"])
    return build_bench_model(**overrides), bench_tokenizer(vocab), vocab


def workload_arguments(description: str) -> argparse.ArgumentParser:
    """The throughput workload's options (issue 2's defaults), shared by its benchmarks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    return parser


def warn_without_openblas() -> None:
    if sys.platform == "linux" and "openblas" not in os.environ.get("LD_PRELOAD", ""):
        print(
            "warning: OpenBLAS is not preloaded; MLX's CPU matmul will be ~40x slower. Run with "
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
            file=sys.stderr,
        )


def build_bench_model(seed: int = 0, **overrides):
    from mlx_lm.utils import _get_classes

    config = dict(BENCH_MODEL, **overrides)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def bench_tokenizer(vocab: int = 32000):
    """A word-level tokenizer covering the random model's whole vocabulary, so the engine's
    incremental detokenization costs what it costs with a real model."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_object=tokenizer))


class DeviceClock:
    """Seconds a step was in flight, measured: on MLX's CPU backend the device is MLX's own
    stream thread (not a Python thread), and a step is in flight exactly while that thread runs
    or waits for a core (Linux ``/proc/self/task/*/schedstat``). None where there is no /proc.
    Waiting for a core counts as in flight, so the load of a shared machine does not read as
    idle time. The stream thread is the busiest thread Python did not start (BLAS workers only
    run while it waits on them)."""

    TASKS = Path("/proc/self/task")

    def __init__(self) -> None:
        self.start = self._stream_threads()

    @classmethod
    def _stream_threads(cls) -> dict[int, int] | None:
        """Nanoseconds each non-Python thread has run or been runnable."""
        if not cls.TASKS.is_dir():
            return None
        python = {t.native_id for t in threading.enumerate()}
        times = {}
        for task in cls.TASKS.iterdir():
            if int(task.name) in python:
                continue
            try:
                ran, waited, _ = (task / "schedstat").read_text().split()
            except OSError:  # the thread ended while listed
                continue
            times[int(task.name)] = int(ran) + int(waited)
        return times

    def busy_seconds(self) -> float | None:
        now = self._stream_threads()
        if now is None or self.start is None:
            return None
        return max((ns - self.start.get(tid, 0) for tid, ns in now.items()), default=0) / 1e9
