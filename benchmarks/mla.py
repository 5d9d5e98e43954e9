"""An MLA model on the engine's latent pages against mlx-lm, same process (issue 47): KV bytes per
token against a per-head cache, decode tok/s at 1 and 16 requests against mlx-lm's
``BatchGenerator`` (its own latent cache), and one layer's prefill attention absorbed (the
engine's: queries in the latent space over the latent rows) against expanded per head (mlx-lm's
prefill: a key and a value per head from the latent, then ``mx.fast`` attention).

Model: GLM-4.7-Flash's attention (20 heads, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 192, v_head_dim 256, q_lora_rank 768, hidden 2048) with fewer layers (2: a dense
one, then a MoE one of 16 experts, 4 per token) and a 32000-token vocabulary, random float32
weights. Decode is timed from the step after every request's first token to its last (the
prefill before it untimed), both sides; wall and CPU time reported (on a shared machine the
CPU-time ratio is the one to trust).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mla [--context 4096] [--requests 1 16] [--decode 32] [--layers 2]
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.bench import Clock, synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

GLM_4_7_FLASH = dict(
    model_type="glm4_moe_lite",
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=10240,
    moe_intermediate_size=1536,
    num_hidden_layers=2,
    num_attention_heads=20,
    num_key_value_heads=20,
    n_shared_experts=1,
    n_routed_experts=16,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    kv_lora_rank=512,
    q_lora_rank=768,
    qk_rope_head_dim=64,
    qk_nope_head_dim=192,
    v_head_dim=256,
    max_position_embeddings=202752,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
)


def kv_bytes(engine: Engine) -> None:
    """The latent pages' bytes per token against a cache of a key and a value per head."""
    c = GLM_4_7_FLASH
    per_head = (
        c["num_hidden_layers"]
        * c["num_attention_heads"]
        * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"])
        * 4
    )
    latent = engine.info.model.kv_bytes_per_token
    print(
        f"KV bytes/token (float32, {c['num_hidden_layers']} layers): latent pages {latent:,}, "
        f"per-head K/V {per_head:,}: x{per_head / latent:.1f} less"
    )


def macbatch_decode(engine: Engine, prompts: list[list[int]], decode: int) -> tuple[float, ...]:
    """(wall s, CPU s, tokens) of the decode steps after every request's first token."""
    params = SamplingParams(max_tokens=decode + 1, temperature=0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    started: set[str] = set()
    while len(started) < len(prompts):
        started |= {out.request_id for out in engine.step() if out.token_ids}
    clock, tokens = Clock(), 0
    while engine.has_unfinished():
        tokens += sum(1 for out in engine.step() if out.token_ids)
    wall, cpu = clock.read()
    return wall, cpu, tokens


def mlx_lm_decode(model, prompts: list[list[int]], decode: int) -> tuple[float, ...]:
    """The same through mlx-lm's ``BatchGenerator``."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=decode + 1, stop_tokens=None)
    uids = gen.insert(prompts, [decode + 1] * len(prompts))
    started: set[int] = set()
    while len(started) < len(uids):
        started |= {r.uid for r in gen.next_generated()}
    clock, tokens = Clock(), 0
    while responses := gen.next_generated():
        tokens += len(responses)
    wall, cpu = clock.read()
    gen.close()
    return wall, cpu, tokens


def prefill_attention(model, length: int) -> None:
    """One layer's attention over a fresh ``length``-token prompt: absorbed over the latent
    rows (the engine's reference path) against expanded per head (mlx-lm's prefill)."""
    from macbatch.metal import AttentionMetadata, LayerParams, paged_attention

    attn = model.model.layers[0].self_attn
    c = GLM_4_7_FLASH
    heads, rank, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope = c["qk_nope_head_dim"]
    mx.random.seed(1)
    latent = mx.random.normal((1, 1, length, rank))
    k_pe = mx.random.normal((1, 1, length, rope))
    q_nope = mx.random.normal((1, heads, length, nope))
    q_pe = mx.random.normal((1, heads, length, rope))
    block = 16
    pages = mx.concatenate([latent, k_pe], axis=-1).reshape(length // block, 1, block, -1)
    tables = mx.arange(length // block, dtype=mx.int32)[None]
    meta = AttentionMetadata.build(tables, np.array([length]), np.array([0, length]))
    mx.eval(latent, k_pe, q_nope, q_pe, pages)

    def absorbed() -> mx.array:
        q = mx.concatenate([attn.embed_q(q_nope), q_pe], axis=-1)[0].transpose(1, 0, 2)
        out = paged_attention(q, pages, pages, meta, LayerParams(attn.scale, value_dim=rank))
        return attn.unembed_out(out.transpose(1, 0, 2)[None])

    def expanded() -> mx.array:
        k = mx.concatenate(
            [
                attn.embed_q(latent, transpose=False),
                mx.broadcast_to(k_pe, (1, heads, length, rope)),
            ],
            axis=-1,
        )
        q = mx.concatenate([q_nope, q_pe], axis=-1)
        v = attn.unembed_out(latent)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask="causal")

    times = {}
    for name, run in (("absorbed", absorbed), ("expanded", expanded)) * 2:
        clock = Clock()
        mx.eval(run())
        times[name] = clock.read()
    a, e = times["absorbed"], times["expanded"]
    print(
        f"one layer's prefill attention, {length} tokens: absorbed over latent rows "
        f"{a[0]:.2f} s wall / {a[1]:.2f} s CPU, expanded per head {e[0]:.2f} s / {e[1]:.2f} s: "
        f"absorbed x{e[1] / a[1]:.2f} (CPU)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens per request")
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--decode", type=int, default=32, help="timed decode tokens each")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=2048, help="0: skip the prefill part")
    args = parser.parse_args()
    warn_without_openblas()
    GLM_4_7_FLASH["num_hidden_layers"] = args.layers
    model = build_bench_model(**GLM_4_7_FLASH)
    tokenizer = bench_tokenizer()
    if args.prefill:
        prefill_attention(model, args.prefill)
    for count in args.requests:
        prompts = synthetic_prompts(count, args.context, args.context, 32000, seed=count)
        blocks = count * (args.context + args.decode + 32) // 16 + count
        config = EngineConfig(num_blocks=blocks, max_num_seqs=count, max_num_batched_tokens=2048)
        engine = Engine(model, tokenizer, config)
        if count == args.requests[0]:
            kv_bytes(engine)
        ours = macbatch_decode(engine, prompts, args.decode)
        engine.close()
        del engine
        mx.synchronize()  # nothing of the engine's in flight while mlx-lm's stream runs
        peer = mlx_lm_decode(model, prompts, args.decode)
        for clock, kind in ((0, "wall"), (1, "cpu")):
            mine, theirs = ours[2] / ours[clock], peer[2] / peer[clock]
            print(
                f"decode, {count} request(s) at {args.context} tokens, {kind}: macbatch "
                f"{mine:.1f} tok/s, mlx-lm BatchGenerator {theirs:.1f} tok/s: "
                f"x{mine / theirs:.2f}"
            )


if __name__ == "__main__":
    main()
