"""MTP drafting (issue 48): macbatch with a checkpoint's MTP layer against mlx-lm's
``generate_step`` of the same target and without speculation, in one process, ratios printed.

The target is a Qwen3.5-shaped float32 hybrid (``qwen3_5``: hidden 1024, ``--layers`` layers,
every fourth full attention and the rest Gated DeltaNet, a tied vocabulary of ``--vocab``
tokens, Qwen3's 151,936 by default) whose
layers add near-identity residuals (their output projections scaled by ``--residual-scale``), so
its next token is nearly a function of the current one: the embedding's, through the final norm
and the tied head. Its MTP layer is set to compute that function of the token it is fed: ``fc``
passes the normed embedding of the next token and drops the hidden state (the identity beside
zeros), its decoder layer's projections are zero (it adds nothing), and its final norm is the
target's, so its drafts hold wherever the target's layers do not move the choice. A random MTP
layer (the same shapes, random weights) is the low-acceptance case. A draft token costs one
decoder layer and the head: at 151,936 tokens and 12 layers the head is 38% of the target's
weights (printed first), where in the 27B to 35B models people run with MTP it is a few percent
of the weights a token reads (a 5,120-wide head of 151,936 tokens is 2.4% of a 32B dense model)
to about a tenth (a 2,048-wide one beside 3B active parameters of a sparse MoE): ``--vocab
32768`` gives this target's head 12%.

1. One request: macbatch with MTP vs mlx-lm's ``generate_step`` vs macbatch without, in
   ``--repeat`` rounds whose order alternates, the prefix cache off (every round prefills the
   whole prompt, as mlx-lm does; with it on, macbatch's rounds after the first read half the
   32-token prompt from cache, which flattered the ratio against mlx-lm). One round each, in
   a fixed order, once read mlx-lm at 2.07 tok/s beside macbatch without MTP at 1.20: the
   load of the moment; in CPU time, decode steps interleaved in one process, the two cost the
   same (docs/speculative.md).
2. ``--batches 2,4,8``: that many concurrent requests, MTP (the policy in charge) vs none, in
   ``--repeat`` alternating rounds too.
3. The random MTP layer at 1 and ``--batches`` requests vs none (never much slower).

Parts 2 and 3 run each batch size's requests once untimed in both arms first (``--warm``
rounds): MLX builds its kernels for the new shapes then, and the policy measures what a drafted
token costs at that batch size (speculative/step_costs.py), as a server that has run a while
has. The load average is printed first: on a shared machine the ratios move with it.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mtp [--layers 24] [--tokens 32] [--batches 8]
"""

from __future__ import annotations

import argparse
import os

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import _get_classes

from benchmarks.common import bench_tokenizer, warn_without_openblas
from benchmarks.speculative import request_seconds
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.adapter import text_model
from macbatch.engine.speculative.mtp_model import MtpHead, new_mtp_head

VOCAB = 151936  # Qwen3's; --vocab sets another
QWEN3_5_08B = dict(
    model_type="qwen3_5",
    hidden_size=1024,
    intermediate_size=3584,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_value_heads=16,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    vocab_size=VOCAB,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)


def near_identity_target(layers: int, scale: float, vocab: int = VOCAB) -> nn.Module:
    """The target, its layers' writes into the residual stream scaled by ``scale``."""
    model_class, args_class = _get_classes(QWEN3_5_08B)
    mx.random.seed(0)
    shape = dict(QWEN3_5_08B, num_hidden_layers=layers, vocab_size=vocab)
    model = model_class(args_class.from_dict(shape))
    model.set_dtype(mx.float32)
    writes = ("o_proj.weight", "out_proj.weight", "down_proj.weight")
    flat = tree_flatten(model.parameters())
    model.load_weights([(k, v * scale) for k, v in flat if k.endswith(writes)], strict=False)
    mx.eval(model.parameters())
    return model


def mtp_layer(model: nn.Module, predicts: bool) -> MtpHead:
    """The target's MTP layer: one that predicts the target's next token, or random weights."""
    text = model.language_model
    mx.random.seed(1)
    head = new_mtp_head(text)
    head.set_dtype(mx.float32)
    if predicts:
        size = text.args.hidden_size
        silent = [(k, v * 0) for k, v in tree_flatten(head.layers[0].parameters())]
        head.layers[0].load_weights([kv for kv in silent if "norm" not in kv[0]], strict=False)
        head.fc.weight = mx.concatenate([mx.eye(size), mx.zeros((size, size))], axis=1)
        head.norm.weight = text.model.norm.weight
    mx.eval(head.parameters())
    return head


def vocab_of(target: nn.Module) -> int:
    return int(text_model(target).args.vocab_size)


def engines(
    target: nn.Module, head: nn.Module, seqs: int, prefix_cache: bool = True, method: str = "mtp"
) -> tuple[Engine, Engine]:
    """macbatch without speculation, and with the drafter ``head`` of ``method`` (the MTP
    layer; benchmarks/dflash.py's DFlash drafter) (``prefix_cache`` False: each round
    prefills its whole prompt again, as mlx-lm's ``generate_step`` does)."""
    tokenizer = bench_tokenizer(vocab_of(target))
    config = dict(num_blocks=256, max_num_seqs=max(seqs, 8), enable_prefix_caching=prefix_cache)
    plain = Engine(target, tokenizer, EngineConfig(**config))
    spec = Engine(target, tokenizer, EngineConfig(speculative=method, **config), draft_model=head)
    return plain, spec


def timed(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[list, tuple]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    outputs: list = []
    seconds = request_seconds(lambda: outputs.extend(engine.generate(prompts, params)))
    return [o.token_ids for o in outputs], seconds


def ratio(name: str, off: tuple, on: tuple, extra: str = "") -> None:
    """``off`` over ``on``, wall and CPU seconds."""
    print(
        f"   {name}: wall x{off[0] / on[0]:.2f}, CPU x{off[1] / on[1]:.2f} "
        f"({off[0]:.2f} s -> {on[0]:.2f} s{extra})"
    )


def report(name: str, off: tuple, on: tuple, engine: Engine, before: tuple[int, int, int]) -> None:
    spec = engine.stats().speculation
    drafted, accepted, verifications = (
        spec.drafted - before[0],
        spec.accepted - before[1],
        spec.verifications - before[2],
    )
    rate = accepted / drafted if drafted else 0.0
    length = (accepted + verifications) / verifications if verifications else 0.0
    extra = f"; {rate:.0%} of {drafted} drafts accepted, {length:.2f} tok/verification"
    ratio(name, off, on, extra)


def counts(engine: Engine) -> tuple[int, int, int]:
    spec = engine.stats().speculation
    return spec.drafted, spec.accepted, spec.verifications


def compare(
    target: nn.Module,
    head: nn.Module,
    sizes: list[int],
    tokens: int,
    warm: int,
    repeat: int,
    title: str,
    method: str = "mtp",
) -> None:
    """Each batch size's two arms in ``repeat`` rounds, their order alternating, seconds
    summed (as ``one_request``)."""
    print(title)
    plain, spec = engines(target, head, max(sizes), method=method)
    first = synthetic_prompts(2, 16, 16, vocab_of(target), seed=9)
    timed(plain, first, 4), timed(spec, first, 4)  # MLX's first compiles, in both arms
    for size in sizes:
        prompts = synthetic_prompts(size, 32, 96, vocab_of(target), seed=size)
        for _ in range(warm):  # this size's shapes, and its measured costs (docstring)
            timed(plain, prompts, tokens), timed(spec, prompts, tokens)
        before = counts(spec)
        sums = {plain: (0.0, 0.0), spec: (0.0, 0.0)}
        replies: dict[Engine, list] = {}
        for round_ in range(repeat):
            for engine in (plain, spec)[:: 1 if round_ % 2 == 0 else -1]:
                replies[engine], (wall, cpu) = timed(engine, prompts, tokens)
                sums[engine] = (sums[engine][0] + wall, sums[engine][1] + cpu)
        assert replies[spec] == replies[plain], f"{method} changed a greedy reply"
        report(f"{size} request(s)", sums[plain], sums[spec], spec, before)


def one_request(
    target: nn.Module, head: nn.Module, tokens: int, repeat: int, method: str = "mtp"
) -> None:
    """The three arms in rounds, their order reversed each round (so the machine's load,
    which moves a lot on a shared one, falls on all three alike), seconds summed."""
    prompt = synthetic_prompts(1, 32, 32, vocab_of(target), seed=3)[0]
    plain, spec = engines(target, head, 1, prefix_cache=False, method=method)
    timed(plain, [prompt], 4), timed(spec, [prompt], 4)
    arms = {
        "generate": lambda: request_seconds(
            lambda: list(generate_step(mx.array(prompt), target, max_tokens=tokens))
        ),
        "without": lambda: timed(plain, [prompt], tokens)[1],
        method: lambda: timed(spec, [prompt], tokens)[1],
    }
    sums = {name: (0.0, 0.0) for name in arms}
    before = counts(spec)
    for round_ in range(repeat):
        for name in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            wall, cpu = arms[name]()
            sums[name] = (sums[name][0] + wall, sums[name][1] + cpu)
    generate, off, on = sums["generate"], sums["without"], sums[method]
    name = {"mtp": "MTP", "dflash": "DFlash", "eagle3": "Eagle-3"}[method]
    total = tokens * repeat
    print(
        f"1. one request, {tokens} new tokens after 32 (whole request, prefill included), "
        f"{repeat} rounds, arms alternating"
    )
    print(
        f"   mlx-lm generate {total / generate[0]:.2f} tok/s, macbatch without "
        f"{total / off[0]:.2f} tok/s, macbatch {name} {total / on[0]:.2f} tok/s (wall)"
    )
    report(f"{name} / mlx-lm generate", generate, on, spec, before)
    ratio(f"{name} / macbatch without", off, on)
    ratio("macbatch without / mlx-lm generate", generate, off)


def parsed(parser: argparse.ArgumentParser, batches: str) -> argparse.Namespace:
    """The arguments every drafter's benchmark of these parts takes, then ``parser``'s own."""
    parser.add_argument("--residual-scale", type=float, default=0.01)
    parser.add_argument("--batches", default=batches, help="concurrent requests, comma-separated")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated")
    parser.add_argument("--warm", type=int, default=1, help="untimed rounds per batch size")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each comparison's arms")
    return parser.parse_args()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--vocab", type=int, default=VOCAB, help="the vocabulary: the LM head's share of a token"
    )
    args = parsed(parser, "8")
    warn_without_openblas()
    print("load average before: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))
    skip = {int(p) for p in args.skip.split(",") if p}
    sizes = [int(s) for s in args.batches.split(",")]
    target = near_identity_target(args.layers, args.residual_scale, args.vocab)
    weights = sum(v.size for _, v in tree_flatten(target.parameters()))
    head = args.vocab * target.language_model.args.hidden_size
    print(f"the LM head (tied): {head / weights:.0%} of the target's {weights / 1e6:.0f}M weights")
    good = mtp_layer(target, predicts=True)
    if 1 not in skip:
        one_request(target, good, args.tokens, args.repeat)
    if 2 not in skip:
        compare(
            target,
            good,
            sizes,
            args.tokens,
            args.warm,
            args.repeat,
            "2. concurrent requests, MTP vs none",
        )
    if 3 not in skip:
        bad = mtp_layer(target, predicts=False)
        compare(
            target,
            bad,
            [1, *sizes],
            args.tokens,
            args.warm,
            args.repeat,
            "3. a random MTP layer vs none",
        )
    print("load average after: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
