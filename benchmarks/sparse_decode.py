"""DeepSeek Sparse Attention decode on the engine against mlx-lm, same process (issue 59): decode
tok/s at long contexts, 1 and 16 requests, against mlx-lm's ``BatchGenerator`` over its own
``deepseek_v32`` code and caches, and the KV bytes per token (latent rows + indexer keys)
against the config's.

Model: GLM-5's (``glm_moe_dsa``; the shape of transformers' ``GlmMoeDsaConfig`` defaults, its
checkpoint zai-org/GLM-5) attention and indexer at full width (hidden 6144, 64 heads, q_lora_rank
2048, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 192, v_head_dim 256; indexer 32
heads of 128, top-2048), cut to 2 dense layers whose MLP is 1024 wide (the same work on both
sides, and what a 2-core CPU holds) and a 32000-token vocabulary, random float32 weights.

Decode skips the prefill, as ``benchmarks/mla.py`` does: each request's context is random latent
rows and indexer keys written into both caches (the engine's pages, their blocks named in the
prefix cache; mlx-lm's ``CacheList`` of two ``KVCache`` per layer), then both run ``--warmup``
untimed steps and time ``--decode`` steps.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.sparse_decode [--context 16384 32768] [--requests 1 16] [--decode 8]
"""

from __future__ import annotations

import argparse
from typing import Any

import mlx.core as mx

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from benchmarks.mla import Timed, fill_engine, macbatch_decode, mlx_lm_decode, print_ratios
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig

GLM_5 = dict(
    model_type="glm_moe_dsa",
    vocab_size=32000,
    hidden_size=6144,
    intermediate_size=1024,
    moe_intermediate_size=2048,
    num_hidden_layers=2,
    num_attention_heads=64,
    num_key_value_heads=64,
    n_shared_experts=1,
    n_routed_experts=256,
    routed_scaling_factor=2.5,
    kv_lora_rank=512,
    q_lora_rank=2048,
    qk_rope_head_dim=64,
    v_head_dim=256,
    qk_nope_head_dim=192,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=8,
    moe_layer_freq=1,
    first_k_dense_replace=3,  # more than the 2 layers: both dense
    max_position_embeddings=202752,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
    attention_bias=False,
    index_topk=2048,
    index_head_dim=128,
    index_n_heads=32,
    tie_word_embeddings=False,
)
LATENT = GLM_5["kv_lora_rank"] + GLM_5["qk_rope_head_dim"]
FULL_DEPTH = 78  # GLM-5's num_hidden_layers


def kv_bytes(engine: Engine) -> None:
    """The pages' bytes per token (latent rows and indexer keys) against the config's."""
    layers, keys = GLM_5["num_hidden_layers"], GLM_5["index_head_dim"]
    expected = layers * (LATENT + keys) * 4
    got = engine.info.model.kv_bytes_per_token
    full = FULL_DEPTH * (LATENT + keys) * 2
    print(
        f"KV bytes/token (float32, {layers} layers): {got:,} = {layers} x ({LATENT} latent + "
        f"{keys} indexer key) x 4, config says {expected:,}; GLM-5's {FULL_DEPTH} layers in "
        f"bf16: {full:,} ({FULL_DEPTH * keys * 2:,} of them indexer keys; DeepSeek's fp8 keys "
        f"would be {FULL_DEPTH * (keys + 4):,})"
    )


def context_rows(count: int, cached: int, seed: int) -> list[list[mx.array]]:
    """Each request's cached rows per engine store layer: every layer's latent rows, then every
    layer's indexer keys (random, as if a prefill had written them)."""
    layers = GLM_5["num_hidden_layers"]
    widths = [LATENT] * layers + [GLM_5["index_head_dim"]] * layers
    key = mx.random.key(seed)
    rows = []
    for request_key in mx.random.split(key, count):
        keys = mx.random.split(request_key, len(widths))
        rows.append([mx.random.normal((cached, w), key=k) for w, k in zip(widths, keys)])
        mx.eval(rows[-1])
    return rows


def mlx_lm_caches(rows: list[list[mx.array]]) -> list[list[Any]]:
    """The same rows as mlx-lm's ``deepseek_v32`` caches hold them: per layer a ``CacheList``
    of the latent ``KVCache`` (latent keys, roped-key values) and the indexer's (its keys, zero
    values, as mlx-lm leaves them)."""
    from mlx_lm.models.cache import CacheList, KVCache

    layers, rank = GLM_5["num_hidden_layers"], GLM_5["kv_lora_rank"]
    caches = []
    for request_rows in rows:
        per_layer = []
        for layer in range(layers):
            latent, keys = request_rows[layer][None, None], request_rows[layers + layer][None, None]
            length = latent.shape[2]
            first, second = KVCache(), KVCache()
            first.state = (latent[..., :rank], latent[..., rank:], length)
            second.state = (keys, mx.zeros_like(keys), length)
            per_layer.append(CacheList(first, second))
        caches.append(per_layer)
    return caches


def engine_decode(
    model, tokenizer, prompts: list[list[int]], rows: list[list[mx.array]], args, first: bool
) -> Timed:
    """The engine's side: a pool for the requests, their full blocks of ``rows`` filled, the
    decode timed; the engine closed after it (nothing of it in flight while mlx-lm's runs)."""
    block = 16
    context = len(prompts[0])
    cached = (context - 1) // block * block  # what the prefix cache serves
    steps = args.warmup + args.decode + 2
    config = EngineConfig(
        num_blocks=len(prompts) * (-(-(context + steps) // block) + 2),
        max_num_seqs=len(prompts),
        max_num_batched_tokens=2048,
    )
    engine = Engine(model, tokenizer, config)
    if first:
        kv_bytes(engine)
    fill_engine(engine, prompts, [[r[:cached] for r in request] for request in rows])
    timed = macbatch_decode(engine, prompts, args.warmup, args.decode)
    engine.close()
    del engine
    mx.synchronize()
    return timed


def decode_run(model, tokenizer, context: int, count: int, args, first: bool) -> None:
    prompts = synthetic_prompts(count, context, context, GLM_5["vocab_size"], seed=count)
    rows = context_rows(count, context - 1, seed=count)
    ours = peer = None
    if args.side in ("both", "macbatch"):
        ours = engine_decode(model, tokenizer, prompts, rows, args, first)
        print(ours.line(f"macbatch, {count} x {context}"), flush=True)
    if args.side in ("both", "mlx-lm"):
        caches = mlx_lm_caches(rows)
        peer = mlx_lm_decode(model, prompts, caches, context - 1, args.warmup, args.decode)
        print(peer.line(f"mlx-lm, {count} x {context}"), flush=True)
    if ours is not None and peer is not None:
        print_ratios(ours, peer, count, context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--decode", type=int, default=8, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed decode steps first")
    parser.add_argument("--side", choices=["both", "macbatch", "mlx-lm"], default="both")
    args = parser.parse_args()
    warn_without_openblas()
    model = build_bench_model(**GLM_5)
    tokenizer = bench_tokenizer()
    first = True
    for context in args.context:
        for count in args.requests:
            decode_run(model, tokenizer, context, count, args, first)
            first = False


if __name__ == "__main__":
    main()
