"""Speculative decoding: macbatch with and without it, beside mlx-lm's ``generate_step`` and
``speculative_generate_step`` (issue 35), all in one process, ratios printed.

1. One request, a Qwen3-0.6B-shaped float32 target (28 layers, hidden 1024, 151,936-token
   vocabulary; ``--layers`` fewer to shorten the run) whose layers past the second add only
   near-identity residuals (their output projections scaled by ``--residual-scale``), and a
   draft made of the target's first two layers with the same embedding, final norm and head:
   1/14 of the layers (8x fewer non-embedding parameters at 16 layers and more), so it agrees
   with the target on most tokens. Wall and CPU seconds of the whole request, each.
2. A copy-heavy job with prompt lookup vs without: 16 documents of 400-600 tokens, up to 8 at
   once, each asking for a field's text; the target is constructed to copy its prompt
   (copying_model.py: an induction-style llama whose weights are set by hand), so its replies
   are the documents' own text, as a trained model's extraction replies are.
3. 32 concurrent requests with prompt lookup vs without (the adaptive rule at work: above
   ``policy.BATCH_LIMITS``'s running requests no step speculates).
4. ``--sweep 1,2,4,8,16,32``: the crossover behind ``BATCH_LIMITS``: for each batch size, that
   many concurrent requests with prompt lookup (the batch limit lifted) vs without, wall and
   CPU ratios and the acceptance each saw. ``--spoil 0,0.5`` repeats it with that share of
   drafted tokens replaced by a wrong one (decided by a hash of the position, so drafting
   stays deterministic and verification exact), to place the crossover at lower acceptance.
   ``--adaptive`` keeps the policy's own batch limit: what a user with that acceptance gets;
   ``--repeat N`` runs each cell (and parts 2 and 6) N times, the arms alternating, and compares
   the sums.
5. ``--batches 4,8,32``: part 1's pair at that many concurrent requests (prompts of 32 to 128
   tokens), draft-model speculation under the adaptive rule vs none; the replies must match.
6. Prompt lookup that never finds anything to propose at 1, 2 and 4 requests vs without: the
   cost of the synchronous steps in which requests retry.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.speculative [--layers 28] [--tokens 64]
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.utils import _get_classes

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from benchmarks.copying_model import copying_model, extraction_job
from macbatch.commands.workload import Clock, synthetic_prompts
from macbatch.engine import DEFAULT_SPECULATIVE_TOKENS, Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.ngram import NgramDrafter
from macbatch.engine.speculative.protocol import Drafter

QWEN3_06B = dict(
    model_type="qwen3",
    hidden_size=1024,
    num_hidden_layers=28,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    max_position_embeddings=8192,
    rope_theta=1e6,
    tie_word_embeddings=True,
)
DRAFT_LAYERS = 2


def target_and_draft(layers: int, residual_scale: float) -> tuple[nn.Module, nn.Module]:
    """The target (later layers near identity) and a draft sharing its first layers' arrays."""
    model_class, args_class = _get_classes(QWEN3_06B)
    mx.random.seed(0)
    target = model_class(args_class.from_dict(dict(QWEN3_06B, num_hidden_layers=layers)))
    target.set_dtype(mx.float32)
    for layer in target.model.layers[DRAFT_LAYERS:]:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * residual_scale
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * residual_scale
    mx.eval(target.parameters())
    draft = model_class(args_class.from_dict(dict(QWEN3_06B, num_hidden_layers=DRAFT_LAYERS)))
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = target.model.layers[:DRAFT_LAYERS]
    draft.model.norm = target.model.norm
    return target, draft


def request_seconds(run) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole request, prefill included. Not "tokens/s after the first
    token": mlx-lm's speculative generator yields its first token after a whole round of drafts
    and verification, and the rest of that round at once, which such a rate counts as free."""
    clock = Clock()
    run()
    return clock.read()


def one_request(args: argparse.Namespace) -> None:
    target, draft = target_and_draft(args.layers, args.residual_scale)
    prompt = synthetic_prompts(1, 32, 32, 151936, seed=3)[0]
    tokenizer = bench_tokenizer(151936)
    k, n = args.draft_tokens or DEFAULT_SPECULATIVE_TOKENS["draft"], args.tokens
    config = dict(num_blocks=64, max_num_seqs=8)
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    plain = Engine(target, tokenizer, EngineConfig(**config))
    spec_config = EngineConfig(speculative="draft", num_speculative_tokens=k, **config)
    engine = Engine(target, tokenizer, spec_config, draft_model=draft)
    runs = {
        "mlx-lm generate": lambda: list(generate_step(mx.array(prompt), target, max_tokens=n)),
        "mlx-lm speculative": lambda: list(
            speculative_generate_step(
                mx.array(prompt), target, draft, num_draft_tokens=k, max_tokens=n
            )
        ),
        "macbatch": lambda: plain.generate([prompt], params),
        "macbatch draft": lambda: engine.generate([prompt], params),
    }
    times = {name: request_seconds(run) for name, run in runs.items()}
    spec = engine.stats().speculation
    print(
        f"1. one request, {args.layers}-layer Qwen3-0.6B-shaped target, {DRAFT_LAYERS}-layer "
        f"draft, {n} new tokens after 32 (whole request, prefill included)"
    )
    print(
        f"   acceptance {spec.acceptance_rate:.0%}, "
        f"{spec.mean_accepted_length:.2f} tok/verification"
    )
    base = times["mlx-lm generate"]
    for name, (wall, cpu) in times.items():
        print(
            f"   {name:<20} {n / wall:6.2f} tok/s  wall x{base[0] / wall:.2f}, "
            f"CPU x{base[1] / cpu:.2f}"
        )
    ours, theirs = times["macbatch draft"], times["mlx-lm speculative"]
    print(
        f"   macbatch draft / mlx-lm speculative: wall x{theirs[0] / ours[0]:.2f}, "
        f"CPU x{theirs[1] / ours[1]:.2f}"
    )


class SpoiledDrafter:
    """Prompt lookup with a share of its drafted tokens made wrong (lower acceptance)."""

    def __init__(self, share: float) -> None:
        self.inner, self.share = NgramDrafter(), share

    def propose(self, requests, ks) -> list[list[int]]:
        proposals = self.inner.propose(requests, ks)
        for request, drafts in zip(requests, proposals):
            start = len(request.all_token_ids)
            for j, token in enumerate(drafts):
                if (((start + j) * 2654435761) % 1000) / 1000 < self.share:
                    drafts[j] = (token + 1) % 32000
        return proposals

    def truncated(self, request_id: str, num_tokens: int) -> None:
        """Nothing is kept per request."""

    def forget(self, request_id: str) -> None:
        """Nothing is kept per request."""


def job_seconds(
    model: nn.Module,
    prompts: list[list[int]],
    tokens: int,
    max_batch: int = 0,
    drafter: Drafter | None = None,
    draft: nn.Module | None = None,
    vocab: int = 32000,
    **config,
) -> tuple:
    """(wall, CPU) seconds of the job, the engine's speculation counts and the replies. CPU
    time is the one to compare on a shared machine: other processes stretch wall time, not the
    work done. ``max_batch``: the policy's batch limit, when not its own."""
    config = dict({"num_blocks": 1024}, **config)
    engine = Engine(model, bench_tokenizer(vocab), EngineConfig(**config), draft_model=draft)
    if max_batch and engine.speculator is not None:
        engine.speculator.policy.max_batch = max_batch
    if drafter is not None and engine.speculator is not None:
        engine.speculator.drafter = drafter
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    clock = Clock()
    outputs = engine.generate(prompts, params)
    return clock.read(), engine.stats().speculation, [o.token_ids for o in outputs]


def print_ratios(off: tuple[float, float], on: tuple[float, float], name: str) -> None:
    for clock, kind in enumerate(("wall", "CPU")):
        print(
            f"   {kind}: without {off[clock]:6.2f} s, with {name} {on[clock]:6.2f} s: "
            f"x{off[clock] / on[clock]:.2f} throughput"
        )


def compare(title: str, prompts: list[list[int]], tokens: int, k: int | None, **config) -> None:
    model = build_bench_model()
    off, _, _ = job_seconds(model, prompts, tokens, **config)
    spec_config = dict(speculative="ngram", num_speculative_tokens=k)
    on, spec, _ = job_seconds(model, prompts, tokens, **spec_config, **config)
    print(title)
    print_ratios(off, on, "prompt lookup")
    print(f"   acceptance {spec.acceptance_rate:.0%} of {spec.drafted} drafted tokens")


def _sum(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def copy_job(k: int, tokens: int, repeat: int) -> None:
    """2. The extraction job on the constructed copier (copying_model.py), with prompt lookup
    and without: the replies must be the same, and are the documents' own text."""
    model = copying_model()
    prompts, answers = extraction_job(16, 400, 600, 32000, seed=7)
    spec_config = dict(speculative="ngram", num_speculative_tokens=k, max_num_seqs=8)
    for config in ({"max_num_seqs": 8}, spec_config):  # warm: the first arm pays no compiles
        job_seconds(model, prompts[:8], 16, **config)
    prefill, off, on = (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)
    for _ in range(repeat):  # alternating arms, each summed: a slow second hits all three
        prefill = _sum(prefill, job_seconds(model, prompts, 1, max_num_seqs=8)[0])
        seconds, _, replies = job_seconds(model, prompts, tokens, max_num_seqs=8)
        off = _sum(off, seconds)
        seconds, spec, spec_replies = job_seconds(model, prompts, tokens, **spec_config)
        on = _sum(on, seconds)
        assert spec_replies == replies, "speculation changed a greedy reply"
    copied = sum(r == a for reply, answer in zip(replies, answers) for r, a in zip(reply, answer))
    print(
        f"2. extraction job on a copying target: 16 documents of 400-600 tokens, {tokens} new "
        f"tokens each, up to 8 at once ({copied / (16 * tokens):.0%} of reply tokens copied)"
        + (f", seconds summed over {repeat} runs" if repeat > 1 else "")
    )
    print_ratios(off, on, "prompt lookup")
    print(
        f"   acceptance {spec.acceptance_rate:.0%} of {spec.drafted} drafted tokens, "
        f"{spec.mean_accepted_length:.2f} tok/verification"
    )
    decode_off, decode_on = off[0] - prefill[0], on[0] - prefill[0]
    print(
        f"   the job with 1 new token (its prefill, the same in both arms): {prefill[0]:.2f} s "
        f"wall, so the ratio cannot pass x{off[0] / prefill[0]:.2f}; after it, decoding took "
        f"{decode_off:.2f} s without and {decode_on:.2f} s with: x{decode_off / decode_on:.2f}"
    )


def draft_batches(args: argparse.Namespace, sizes: list[int]) -> None:
    """5. The part-1 pair at several concurrent requests: draft-model speculation (the
    adaptive rule in charge) vs none."""
    target, draft = target_and_draft(args.layers, args.residual_scale)
    print(f"5. draft model at concurrent requests ({args.layers}-layer target, {args.tokens} new)")
    for size in sizes:
        prompts = synthetic_prompts(size, 32, 128, 151936, seed=size)
        config = dict(vocab=151936, max_num_seqs=64, num_blocks=256)
        off, _, replies = job_seconds(target, prompts, args.tokens, **config)
        spec_config = dict(speculative="draft", num_speculative_tokens=args.draft_tokens)
        on, spec, spec_replies = job_seconds(
            target, prompts, args.tokens, draft=draft, **spec_config, **config
        )
        assert spec_replies == replies, "speculation changed a greedy reply"
        print(
            f"   {size:3d} requests: wall x{off[0] / on[0]:.2f} ({off[0]:.1f} / {on[0]:.1f} s), "
            f"CPU x{off[1] / on[1]:.2f}, {spec.drafted} drafted, "
            f"acceptance {spec.acceptance_rate:.0%}, "
            f"{spec.mean_accepted_length:.2f} tok/verification"
        )


class NoProposals:
    """A drafter that never finds anything: replies that never repeat their context."""

    def propose(self, requests, ks) -> list[list[int]]:
        return [[] for _ in requests]

    def truncated(self, request_id: str, num_tokens: int) -> None:
        """Nothing is kept per request."""

    def forget(self, request_id: str) -> None:
        """Nothing is kept per request."""


def no_proposals(sizes: list[int], tokens: int, repeat: int) -> None:
    """6. Prompt lookup that never finds a match vs no speculation: what the requests' idle
    rests (policy.MAX_IDLE_REST) cost, each step a request retries being synchronous."""
    model = build_bench_model()
    print(f"6. prompt lookup with nothing to propose vs without ({tokens} new tokens)")
    for size in sizes:
        prompts = synthetic_prompts(size, 32, 256, 32000, seed=size)
        off, on = (0.0, 0.0), (0.0, 0.0)
        for _ in range(repeat):
            off = _sum(off, job_seconds(model, prompts, tokens, max_num_seqs=64)[0])
            config = dict(speculative="ngram", max_num_seqs=64)
            on = _sum(on, job_seconds(model, prompts, tokens, 0, NoProposals(), **config)[0])
        print(
            f"   {size:3d} requests: wall x{off[0] / on[0]:.2f} ({off[0]:.2f} / {on[0]:.2f} s), "
            f"CPU x{off[1] / on[1]:.2f}"
        )


def sweep(sizes: list[int], spoils: list[float], tokens: int, adaptive: bool, repeat: int) -> None:
    """Speculation's gain by batch size and acceptance, the batch limit lifted (where it
    crosses x1) or, ``adaptive``, the policy's own (what a user gets)."""
    model = build_bench_model()
    limit = "the policy's batch limit" if adaptive else "no batch limit"
    print(f"4. batch-size sweep, prompt lookup with {limit} vs without")
    config = dict(speculative="ngram", max_num_seqs=64)
    warm = synthetic_prompts(4, 32, 64, 32000, seed=99)
    for arm in ({"max_num_seqs": 64}, config):  # warm: the first arm pays no compiles
        job_seconds(model, warm, 8, **arm)
    max_batch = 0 if adaptive else 1 << 20
    for spoil, size in ((s, n) for s in spoils for n in sizes):
        prompts = synthetic_prompts(size, 32, 256, 32000, seed=size)
        off, on = (0.0, 0.0), (0.0, 0.0)
        for _ in range(repeat):  # alternating arms, each summed: a slow second hits both
            off = _sum(off, job_seconds(model, prompts, tokens, max_num_seqs=64)[0])
            drafter = SpoiledDrafter(spoil) if spoil else None
            seconds, spec, _ = job_seconds(model, prompts, tokens, max_batch, drafter, **config)
            on = _sum(on, seconds)
        print(
            f"   spoil {spoil:.2f}, {size:3d} requests: wall x{off[0] / on[0]:.2f} "
            f"({off[0]:.2f} / {on[0]:.2f} s{f' over {repeat} runs' if repeat > 1 else ''}), "
            f"CPU x{off[1] / on[1]:.2f}, acceptance {spec.acceptance_rate:.0%}, "
            f"{spec.mean_accepted_length:.2f} tok/verification"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--draft-tokens", type=int, help="k of parts 1 to 3 (default: the engine's, per method)"
    )
    parser.add_argument("--residual-scale", type=float, default=0.01)
    parser.add_argument("--skip", default="", help="parts to skip, e.g. 1,3")
    parser.add_argument("--sweep", default="", help="batch sizes of part 4, e.g. 1,4,16,32")
    parser.add_argument("--spoil", default="0", help="part 4's shares of drafts made wrong")
    parser.add_argument(
        "--adaptive", action="store_true", help="part 4 under the policy's own batch limit"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of parts 2 and 6 and each part-4 cell"
    )
    parser.add_argument("--batches", default="4,8,32", help="part 5's concurrent requests")
    args = parser.parse_args()
    warn_without_openblas()
    skip = set(args.skip.split(","))
    if "1" not in skip:
        one_request(args)
    if "2" not in skip:
        copy_job(args.draft_tokens, 96, args.repeat)
    if "3" not in skip:
        prompts = synthetic_prompts(32, 32, 512, 32000, seed=0)
        title = "3. 32 concurrent requests"
        compare(title, prompts, args.tokens, args.draft_tokens, max_num_seqs=64)
    if args.sweep:
        spoils = [float(x) for x in args.spoil.split(",")]
        sizes = [int(n) for n in args.sweep.split(",")]
        sweep(sizes, spoils, args.tokens, args.adaptive, args.repeat)
    if "5" not in skip:
        draft_batches(args, [int(n) for n in args.batches.split(",")])
    if "6" not in skip:
        no_proposals([1, 2, 4], args.tokens, args.repeat)


if __name__ == "__main__":
    main()
