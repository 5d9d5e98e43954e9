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
4. ``--peer mlx-vlm``: one request, greedy, macbatch's DFlash against mlx-vlm's own DFlash
   generation (its ``generate_step`` with its drafter), on a target mlx-vlm's round loop takes: a
   Qwen3.5-shaped one (mlx-vlm's ``qwen3_5_text``: Gated DeltaNet layers, every fourth full
   attention; ``--layers`` of them) and its agreeing DFlash drafter, both saved as checkpoints
   that each side loads with its own loader; the two replies' tokens must be equal.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.dflash [--drafter eagle3] [--layers 8] [--tokens 32] [--batches 16]
        [--peer mlx-vlm [--skip 1,2,3]]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import _get_classes

from benchmarks.common import warn_without_openblas
from benchmarks.mtp import compare, counts, one_request, parsed, report, timed
from benchmarks.speculative import QWEN3_06B, request_seconds
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig
from tests.support.dflash import agreeing_dflash, random_dflash, save_dflash_checkpoint
from tests.support.eagle3 import agreeing_eagle3, random_eagle3
from tests.support.tiny_vlm_text import save_vlm_model, vlm_text_model

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


# part 4's target: Qwen3.5's layout (mlx-vlm's text-only qwen3_5_text; its DFlash round loop is
# shaped for Qwen3.5 and Gemma 4) at parts 1-3's hidden size, so the drafter's shapes are theirs;
# rotary dims a quarter of a head, as Qwen3.5's, their M-RoPE sections summing to its 32 pairs
QWEN3_5_SHAPE: dict[str, Any] = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    full_attention_interval=4,
    rope_parameters={
        "type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
    },
)


def peer_checkpoints(root: Path, layers: int, vocab: int, scale: float) -> tuple[Path, Path]:
    """The Qwen3.5-shaped target (its layers scaled by ``scale``) and the DFlash drafter that
    agrees with it, saved under ``root``: both sides load the same files, each its own way."""
    target, config = vlm_text_model(
        "qwen3_5_text", num_hidden_layers=layers, vocab_size=vocab, **QWEN3_5_SHAPE
    )
    drafter = agreeing_dflash(target, scale=scale, block_size=16)
    target_path = save_vlm_model(root / "target", "qwen3_5_text", target, config)
    return target_path, save_dflash_checkpoint(root / "drafter", drafter, target)


# a peer's run of one request: (prompt, new tokens) -> its token ids
PeerRun = Callable[[list[int], int], list[int]]


def mlx_vlm_dflash(target: Path, drafter: Path) -> tuple[PeerRun, Any]:
    """mlx-vlm's own DFlash generation, as its ``generate --draft-model`` runs it: the target by
    its ``load_model``, the drafter by its ``load_drafter``, its ``generate_step`` at temperature
    0 (prefill, then its round loop: adaptive blocks up to the drafter's 16). Returns the run
    (prompt, tokens -> its token ids) and the drafter (its lifetime counters)."""
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.utils import load_model

    model = load_model(target)
    draft, kind = load_drafter(str(drafter), kind="dflash")

    def run(prompt: list[int], tokens: int) -> list[int]:
        steps = generate_step(
            mx.array([prompt]),
            model,
            None,
            None,
            max_tokens=tokens,
            temperature=0.0,
            draft_model=draft,
            draft_kind=kind,
        )
        return [int(token) for token, _ in steps]

    return run, draft


def peer_request(
    layers: int, vocab: int, scale: float, tokens: int, warm: int, repeat: int
) -> None:
    """Part 4 on checkpoints in a folder kept until it ends (MLX reads weights lazily)."""
    with tempfile.TemporaryDirectory() as root:
        target, drafter = peer_checkpoints(Path(root), layers, vocab, scale)
        peer_rounds(target, drafter, layers, vocab, tokens, warm, repeat)


def peer_rounds(
    target: Path, drafter: Path, layers: int, vocab: int, tokens: int, warm: int, repeat: int
) -> None:
    """Part 4: macbatch's DFlash (``Engine.load`` of the target, ``--draft-model`` the drafter;
    prefix cache off, as mlx-vlm prefills each request whole) vs mlx-vlm's own, one request,
    ``repeat`` rounds whose order alternates, after ``warm`` untimed whole requests of each (the
    engine's policy starts a request at 4 drafts and doubles them while all hold, until 8
    verifications have held: then at the full 15; mlx-vlm starts at its block ceiling); every
    round's tokens of both must be equal."""
    peer, draft = mlx_vlm_dflash(target, drafter)
    config = EngineConfig(
        speculative="dflash", draft_model=str(drafter), num_blocks=256, enable_prefix_caching=False
    )
    engine = Engine.load(str(target), config)
    prompt = synthetic_prompts(1, 32, 32, vocab, seed=3)[0]
    for _ in range(warm):
        peer(prompt, tokens), timed(engine, [prompt], tokens)
    replies: dict[str, list[list[int]]] = {"mlx-vlm": [], "macbatch": []}

    def run_peer() -> None:
        replies["mlx-vlm"].append(peer(prompt, tokens))

    def run_engine() -> None:
        replies["macbatch"].append(timed(engine, [prompt], tokens)[0][0])

    arms = {"mlx-vlm": run_peer, "macbatch": run_engine}
    sums = dict.fromkeys(arms, (0.0, 0.0))
    before = counts(engine)
    peer_before = _peer_counts(draft)
    for round_ in range(repeat):
        for name in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            wall, cpu = request_seconds(arms[name])
            sums[name] = (sums[name][0] + wall, sums[name][1] + cpu)
    total = tokens * repeat
    print(
        f"4. one request, {tokens} new tokens after 32 (whole request, prefill included), "
        f"{repeat} rounds after {warm} untimed, arms alternating; Qwen3.5-shaped target "
        f"({layers} layers, mlx-vlm's qwen3_5_text), DFlash drafter of blocks of 16, both from "
        "the same checkpoints"
    )
    for name, (wall, cpu) in sums.items():
        print(f"   {name} DFlash: {total / wall:.2f} tok/s wall, {total / cpu:.2f} tok/s CPU")
    rounds, accepted, drafted = (a - b for a, b in zip(_peer_counts(draft), peer_before))
    print(
        f"   mlx-vlm: {accepted:.0f} of {drafted} drafts accepted in {rounds} rounds, "
        f"{(accepted + rounds) / max(rounds, 1):.2f} tok/round"
    )
    report("macbatch DFlash / mlx-vlm DFlash", sums["mlx-vlm"], sums["macbatch"], engine, before)
    same = replies["mlx-vlm"] == replies["macbatch"]
    print(f"   tokens equal (greedy, every round): {same}")
    if not same:
        raise SystemExit(f"the replies differ: {replies}")


def _peer_counts(draft: Any) -> tuple[int, float, int]:
    """mlx-vlm's drafter's lifetime counters (rounds, accepted, drafted), which its ``reset``
    between requests keeps."""
    return (
        int(getattr(draft, "speculative_total_rounds", 0)),
        float(getattr(draft, "speculative_total_accepted", 0.0)),
        int(getattr(draft, "speculative_total_drafted", 0)),
    )


def drafter_parts(args: argparse.Namespace, skip: set[int]) -> None:
    """Parts 1-3 (those not in ``skip``): the Qwen3-shaped target with ``--drafter``'s drafters."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--drafter", choices=sorted(DRAFTERS), default="dflash")
    parser.add_argument(
        "--peer", choices=["mlx-vlm"], help="part 4: DFlash against mlx-vlm's own DFlash"
    )
    args = parsed(parser, "16")
    warn_without_openblas()
    print("load average before: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))
    skip = {int(p) for p in args.skip.split(",") if p}
    if {1, 2, 3} - skip:  # the Qwen3 target only where a part of it runs
        drafter_parts(args, skip)
    if args.peer:
        scale = args.residual_scale
        peer_request(args.layers, args.vocab, scale, args.tokens, args.warm, args.repeat)
    print("load average after: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
