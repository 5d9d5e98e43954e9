"""The demo model's training step: mlx's own ops against scripts/fast_training_ops.py, same process.

Both steps are the training script's compiled AdamW step on the same batches, drawn by the
script's own generators: phase 1 (8 questions asked alone) and phase 2 (2 conversations of 1 to 8
turns, up to 512 tokens). Windows of one pass over the batches alternate between the two steps so
that load drifting on a shared machine hits both alike; medians over the windows are reported,
and the ratio window by window. Before timing, the loss and gradients of the two are compared on
each phase's first batch (for the gradients, the largest difference in any array relative to that
array's largest value).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.demo_training [--batches 16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from benchmarks.common import warn_without_openblas

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import train_demo_model as training  # noqa: E402
from fast_training_ops import fast_cross_entropy, fast_training_ops  # noqa: E402


def largest_gradient_difference(model: nn.Module, batch: tuple[mx.array, ...]) -> tuple:
    """(relative loss difference, largest gradient difference relative to its array's largest
    value)."""
    tokens = batch[2].sum()
    exact = nn.value_and_grad(model, training.loss_fn)(model, *batch, tokens)
    with fast_training_ops():
        fast_loss = partial(training.loss_fn, per_token=fast_cross_entropy)
        fast = nn.value_and_grad(model, fast_loss)(model, *batch, tokens)
    loss_gap = abs((exact[0] - fast[0]) / exact[0]).item()
    grads = zip(tree_flatten(exact[1]), tree_flatten(fast[1]))
    gaps = [(mx.abs(a - b).max() / mx.abs(a).max()).item() for (_, a), (_, b) in grads]
    return loss_gap, max(gaps)


def time_window(step, batches: list[tuple[mx.array, ...]], state) -> float:
    """Seconds per step over one pass."""
    start = time.perf_counter()
    for inputs, targets, mask in batches:
        mx.eval(state, step(inputs, targets, mask, mask.sum()))
    return (time.perf_counter() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=16, help="batches per phase and window")
    parser.add_argument("--repeats", type=int, default=7, help="windows per step and phase")
    args = parser.parse_args()
    warn_without_openblas()
    mx.set_default_device(mx.cpu)
    from mlx_lm.models.llama import Model, ModelArgs

    tokenizer = training.build_tokenizer()
    config = dict(training.MODEL_CONFIG, vocab_size=tokenizer.get_vocab_size())
    weights = training.parse_weights(training.TASK_WEIGHTS)
    rng = random.Random(0)
    phases = {
        "phase 1": training.make_single_turn_batches(tokenizer, rng, 8, args.batches, weights),
        "phase 2": training.make_conversation_batches(
            tokenizer, rng, 2, args.batches, weights, 8, config["max_position_embeddings"], 0.0
        ),
    }
    group = mx.distributed.init()
    print("step          | exact ms | fast ms | exact/fast | loss diff | grad diff | tokens/row")
    for name, batches in phases.items():
        model = Model(ModelArgs.from_dict(config))
        model.load_weights(str(training.MODEL_DIR / "model.safetensors"))
        mx.eval(model.parameters())
        loss_gap, grad_gap = largest_gradient_difference(model, batches[0])
        steps = {
            fast: training.make_train_step(model, 1e-5, 10**6, group, fast)
            for fast in (False, True)
        }
        for step, state, _ in steps.values():
            time_window(step, batches, state)  # trace every shape once
        windows: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for fast, (step, state, _) in steps.items():
                windows[fast].append(time_window(step, batches, state))
        ratio = statistics.median(e / f for e, f in zip(windows[False], windows[True]))
        width = statistics.mean(batch[0].shape[1] for batch in batches)
        exact_ms, fast_ms = (statistics.median(windows[f]) * 1e3 for f in (False, True))
        print(
            f"{name:13s} | {exact_ms:8.1f} | {fast_ms:7.1f} | {f'x{ratio:.2f}':>10} |"
            f" {loss_gap:9.1e} | {grad_gap:9.1e} | {width:10.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
