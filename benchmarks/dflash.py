"""DFlash drafting (issue 63): macbatch with a DFlash drafter against mlx-lm's ``generate_step``
of the same target and against itself without speculation, in one process, ratios printed.

The target is a Qwen3-0.6B-shaped float32 dense model (hidden 1024, ``--layers`` layers, a tied
vocabulary of ``--vocab`` tokens) whose layers add near-identity residuals (their output
projections scaled by ``--residual-scale``), so its next token is nearly a function of the
current one, and with the tied head that function mostly keeps the token. The drafter that
agrees with it is tests/support/dflash.py's: two layers reading target layers 0, L/2 and L-1,
built so that every block row computes that function of the block's known token, so whole
blocks hold. A random drafter (the same shapes) is the floor: its blocks are rejected, and the
policy rests it.

1. One request: DFlash vs mlx-lm's ``generate_step`` vs macbatch without (benchmarks/mtp.py's
   arms: ``--repeat`` rounds whose order alternates, prefix cache off).
2. ``--batches``: that many concurrent requests, DFlash vs none.
3. The random drafter at 1 and ``--batches`` requests vs none.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.dflash [--layers 8] [--tokens 32] [--batches 16]
"""

from __future__ import annotations

import argparse
import os

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import _get_classes

from benchmarks.common import warn_without_openblas
from benchmarks.mtp import compare, one_request, parsed
from benchmarks.speculative import QWEN3_06B
from tests.support.dflash import agreeing_dflash, random_dflash


def qwen3_target(layers: int, vocab: int) -> nn.Module:
    model_class, args_class = _get_classes(QWEN3_06B)
    mx.random.seed(0)
    shape = dict(QWEN3_06B, num_hidden_layers=layers, vocab_size=vocab)
    model = model_class(args_class.from_dict(shape))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32768)
    args = parsed(parser, "16")
    warn_without_openblas()
    print("load average before: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))
    skip = {int(p) for p in args.skip.split(",") if p}
    sizes = [int(s) for s in args.batches.split(",")]
    target = qwen3_target(args.layers, args.vocab)
    # scales the target's layers; a block of 16, as z-lab's checkpoints
    good = agreeing_dflash(target, scale=args.residual_scale, block_size=16)
    if 1 not in skip:
        one_request(target, good, args.tokens, args.repeat, method="dflash")
    if 2 not in skip:
        title = "2. concurrent requests, DFlash vs none"
        compare(target, good, sizes, args.tokens, args.warm, args.repeat, title, "dflash")
    if 3 not in skip:
        bad = random_dflash(target, block_size=16)
        title = "3. a random DFlash drafter vs none"
        compare(target, bad, [1, *sizes], args.tokens, args.warm, args.repeat, title, "dflash")
    print("load average after: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
