"""Drafters that read the target's layer features (issue 63): macbatch with a DFlash or an Eagle-3
drafter (``--drafter``) against mlx-lm's ``generate_step`` of the same target and against itself
without speculation, in one process, ratios printed.

The target is a Qwen3-0.6B-shaped float32 dense model (hidden 1024, ``--layers`` layers, a tied
vocabulary of ``--vocab`` tokens) whose layers add near-identity residuals (their output
projections scaled by ``--residual-scale``), so its next token is nearly a function of the
current one, and with the tied head that function mostly keeps the token. The drafters that
agree with it are tests/support/dflash.py's (two layers reading target layers 0, L/2 and L-1,
built so that every block row computes that function of the block's known token, so whole
blocks hold) and tests/support/eagle3.py's (one layer over the same target layers, whose
attention passes each row's token on, so its drafts hold where the target keeps its token). A
random drafter (the same shapes) is the floor: its drafts are rejected, and the policy rests it.

1. One request: the drafter vs mlx-lm's ``generate_step`` vs macbatch without
   (benchmarks/mtp.py's arms: ``--repeat`` rounds whose order alternates, prefix cache off).
2. ``--batches``: that many concurrent requests, the drafter vs none.
3. The random drafter at 1 and ``--batches`` requests vs none.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.dflash [--drafter eagle3] [--layers 8] [--tokens 32] [--batches 16]
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
from tests.support.eagle3 import agreeing_eagle3, random_eagle3

# each drafter's name, the one built to agree with the target (which scales the target's
# layers: ``scale``) and a random one; DFlash's blocks of 16, as z-lab's checkpoints
DRAFTERS = {
    "dflash": (
        "DFlash",
        lambda target, scale: agreeing_dflash(target, scale=scale, block_size=16),
        lambda target: random_dflash(target, block_size=16),
    ),
    "eagle3": (
        "Eagle-3",
        lambda target, scale: agreeing_eagle3(target, scale=scale),
        random_eagle3,
    ),
}


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
    parser.add_argument("--drafter", choices=sorted(DRAFTERS), default="dflash")
    args = parsed(parser, "16")
    warn_without_openblas()
    print("load average before: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))
    skip = {int(p) for p in args.skip.split(",") if p}
    sizes = [int(s) for s in args.batches.split(",")]
    target = qwen3_target(args.layers, args.vocab)
    name, agreeing, random = DRAFTERS[args.drafter]
    method = args.drafter
    good = agreeing(target, args.residual_scale)
    if 1 not in skip:
        one_request(target, good, args.tokens, args.repeat, method=method)
    if 2 not in skip:
        title = f"2. concurrent requests, {name} vs none"
        compare(target, good, sizes, args.tokens, args.warm, args.repeat, title, method)
    if 3 not in skip:
        title = f"3. a random {name} drafter vs none"
        bad = random(target)
        compare(target, bad, [1, *sizes], args.tokens, args.warm, args.repeat, title, method)
    print("load average after: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
