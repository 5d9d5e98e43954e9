"""What a never-accepted MTP layer costs a non-hybrid model, with and without the compiled decode
step for its plain decode steps (issue 48), in one process, ratios printed.

The target is a GLM-4.5-Air-shaped (``glm4_moe``) float32 model with random weights (the first
layer dense, the rest sparse MoE), its MTP layer random too (built as the checkpoint's
layer ``num_hidden_layers``), so its drafts are never accepted and its requests rest from
drafting: most of their steps are plain decode steps. Three engines on the same target:
without speculation, MTP with its plain decode steps uncompiled (``compile_decode_after=None``:
what the runner did before it kept the compiled step's hidden states), and MTP compiled as the
runner does now; the engine without speculation is compiled too (``compile_decode_after=0``,
after an untimed warm-up that builds MLX's kernels, as in a server that has run a while). Each
batch size's arms run in ``--repeat`` rounds, their order reversed each round, seconds summed;
the ratio is the engine without over the MTP arm (above 1: MTP faster). The greedy replies of
the three arms must be equal.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mtp_compiled [--hidden 256] [--layers 4] [--batches 1,4]
"""

from __future__ import annotations

import argparse
import os

import mlx.core as mx
import mlx.nn as nn

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from benchmarks.mtp import timed
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig
from macbatch.engine.model.families import MtpNaming
from macbatch.engine.speculative.mtp_model import new_mtp_head

VOCAB = 32000


# GLM-4.5-Air's config.json (a dense first layer, then 128 routed experts, 8 a token, and a
# shared one); the benchmark scales its width, depth and experts down (``glm4_moe_target``)
GLM4_5_AIR = dict(
    model_type="glm4_moe",
    hidden_size=4096,
    num_hidden_layers=46,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_attention_heads=96,
    num_key_value_heads=8,
    head_dim=128,
    n_routed_experts=128,
    num_experts_per_tok=8,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    partial_rotary_factor=0.5,
    attention_bias=True,
    use_qk_norm=False,
    rope_theta=1e6,
    rope_scaling=None,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    vocab_size=VOCAB,  # GLM's is 151,552
)


def glm4_moe_target(hidden: int, layers: int) -> nn.Module:
    """GLM-4.5-Air's shape at width ``hidden`` and depth ``layers`` (heads of 32, a quarter of
    GLM's 128 and a multiple of 8 as the CPU kernel's compiled path needs; query width twice
    ``hidden``, up to 8 query heads a KV head; 16 routed experts, 4 a token), random float32."""
    heads = hidden // 16
    return build_bench_model(
        **dict(
            GLM4_5_AIR,
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=hidden * 8 // 3,
            moe_intermediate_size=hidden // 3,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 8),
            head_dim=32,
            n_routed_experts=16,
            num_experts_per_tok=4,
        )
    )


def engines(target: nn.Module, seqs: int) -> dict[str, Engine]:
    """The three arms (module docstring), by name."""
    tokenizer = bench_tokenizer(VOCAB)
    mx.random.seed(1)
    head = new_mtp_head(target, MtpNaming.NEXTN)  # random: its drafts never hold
    head.set_dtype(mx.float32)
    mx.eval(head.parameters())
    config = dict(num_blocks=512, max_num_seqs=max(seqs, 8), compile_decode_after=0)
    mtp = dict(config, speculative="mtp")
    return {
        "without": Engine(target, tokenizer, EngineConfig(**config)),
        "mtp uncompiled": Engine(
            target,
            tokenizer,
            EngineConfig(**dict(mtp, compile_decode_after=None)),
            draft_model=head,
        ),
        "mtp compiled": Engine(target, tokenizer, EngineConfig(**mtp), draft_model=head),
    }


def compare(arms: dict[str, Engine], size: int, tokens: int, repeat: int) -> None:
    """One batch size: a warm round, then ``repeat`` alternating rounds; ratios printed."""
    prompts = synthetic_prompts(size, 32, 96, VOCAB, seed=size)
    for engine in arms.values():  # this size's shapes compiled and traced, costs measured
        timed(engine, prompts, tokens)
    sums = {name: (0.0, 0.0) for name in arms}
    replies = {}
    before = {name: e.stats().speculation.drafted for name, e in arms.items()}
    for round_ in range(repeat):
        for name in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            replies[name], (wall, cpu) = timed(arms[name], prompts, tokens)
            sums[name] = (sums[name][0] + wall, sums[name][1] + cpu)
    assert len({str(r) for r in replies.values()}) == 1, "an arm changed a greedy reply"
    off = sums["without"]
    print(f"{size} request(s), {tokens} new tokens each, {repeat} rounds:")
    for name in ("mtp uncompiled", "mtp compiled"):
        on, engine = sums[name], arms[name]
        drafted = engine.stats().speculation.drafted - before[name]
        compiled = engine.runner.compiled
        shapes = 0 if compiled is None else compiled.compiled_shapes
        if compiled is not None and not shapes:
            raise SystemExit("nothing ran compiled: is the CPU kernel the attention backend?")
        print(
            f"   without / {name}: wall x{off[0] / on[0]:.3f}, CPU x{off[1] / on[1]:.3f} "
            f"({off[1]:.2f} -> {on[1]:.2f} CPU s; {drafted} drafts, {shapes} compiled shapes)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,4", help="concurrent requests, comma-separated")
    parser.add_argument("--repeat", type=int, default=4, help="rounds of each comparison's arms")
    args = parser.parse_args()
    warn_without_openblas()
    print("load average before: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))
    sizes = [int(s) for s in args.batches.split(",")]
    target = glm4_moe_target(args.hidden, args.layers)
    arms = engines(target, max(sizes))
    for size in sizes:
        compare(arms, size, args.tokens, args.repeat)
    print("load average after: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
