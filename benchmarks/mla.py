"""An MLA model on the engine's latent pages against mlx-lm, same process (issue 47): KV bytes per
token against a per-head cache, decode tok/s at 1 and 16 requests against mlx-lm's
``BatchGenerator`` (its own latent cache), and one layer's prefill attention absorbed (the
engine's: queries in the latent space over the latent rows) against expanded per head (mlx-lm's
prefill: a key and a value per head from the latent, then ``mx.fast`` attention).

Model: GLM-4.7-Flash's attention (20 heads, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 192, v_head_dim 256, q_lora_rank 768, hidden 2048) with fewer layers (2: a dense
one, then a MoE one of 16 experts, 4 per token) and a 32000-token vocabulary, random float32
weights.

Decode skips the prefill: each request's context is random latent rows written straight into
both caches, the same rows on both sides (``fill_engine``: the engine's latent pages, their
blocks named in the prefix cache as a finished request with that prompt leaves them;
``mlx_lm_caches``: mlx-lm's own ``KVCache`` per layer, latent as keys and RoPE key as values,
handed to ``BatchGenerator.insert``). Both then prefill only the prompt's last block, run
``--warmup`` untimed decode steps (the engine compiles its decode step after them) and time
``--decode`` steps. Wall and CPU time are reported (on a shared machine the CPU-time ratio is
the one to trust), and per step the Python thread's CPU time (the host's part).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mla [--context 4096] [--requests 1 16] [--decode 16] [--layers 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from benchmarks.mla_attention import mlx_lm_attention_runs
from macbatch.commands.workload import Clock, synthetic_prompts
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


@dataclass(frozen=True)
class Timed:
    """Decode steps timed: wall and process CPU seconds, the Python thread's CPU seconds (the
    host's part: scheduling, packing, building the graph; MLX computes on its own threads)."""

    wall: float
    cpu: float
    host: float
    tokens: int
    steps: int

    def line(self, name: str) -> str:
        per_step = 1000 / self.steps
        return (
            f"  {name}: per step {self.wall * per_step:.0f} ms wall, {self.cpu * per_step:.0f} ms "
            f"CPU, of it {self.host * per_step:.0f} ms on the Python thread"
        )


def latent_rows(count: int, cached: int, layers: int, seed: int) -> list[mx.array]:
    """Each request's cached latent rows, ``[layers, cached, kv_lora_rank + qk_rope_head_dim]``:
    random, as if a prefill had written them (what decode reads costs the same)."""
    width = GLM_4_7_FLASH["kv_lora_rank"] + GLM_4_7_FLASH["qk_rope_head_dim"]
    key = mx.random.key(seed)
    rows = [mx.random.normal((layers, cached, width), key=k) for k in mx.random.split(key, count)]
    mx.eval(rows)
    return rows


def fill_engine(
    engine: Engine, prompts: list[list[int]], rows: Sequence[Sequence[mx.array]]
) -> None:
    """Write each prompt's cached rows (per store layer ``[cached, width]``) into the pages and
    name their blocks in the prefix cache, as a finished request with that prompt would have
    left them: the requests added next find them there and prefill only their last block."""
    block = engine.config.block_size
    for index, (prompt, request_rows) in enumerate(zip(prompts, rows, strict=True)):
        request = engine.prepare_request(prompt, SamplingParams(max_tokens=1), f"fill-{index}")
        cached = request_rows[0].shape[0]
        assert engine.kv.allocate_slots(request.request_id, 0, cached), "pool too small"
        table = np.asarray(engine.kv.block_table(request.request_id))
        flat = (table[:, None] * block + np.arange(block)).reshape(-1)[:cached]
        where = mx.array(flat.astype(np.int32))
        for layer, pages in enumerate(engine.runner.store.keys):
            pages[where] = request_rows[layer]
        engine.kv.cache_full_blocks(request, cached)
        engine.kv.free(request.request_id)
        mx.eval(engine.runner.store.arrays())


def mlx_lm_caches(rows: list[mx.array]) -> list[list[Any]]:
    """The same rows as mlx-lm's own MLA cache holds them: per layer a ``KVCache`` whose keys
    are the latent and whose values the roped shared key."""
    from mlx_lm.models.cache import KVCache

    rank = GLM_4_7_FLASH["kv_lora_rank"]
    caches = []
    for request_rows in rows:
        layers = []
        for layer_rows in request_rows:
            cache = KVCache()
            rows_4d = layer_rows[None, None]
            cache.state = (rows_4d[..., :rank], rows_4d[..., rank:], layer_rows.shape[0])
            layers.append(cache)
        caches.append(layers)
    return caches


def macbatch_decode(engine: Engine, prompts: list[list[int]], warmup: int, decode: int) -> Timed:
    """The timing of ``decode`` steps, after every request's first token and
    ``warmup`` more steps (decode steps compile after a few: ``compile_decode_after``)."""
    params = SamplingParams(max_tokens=warmup + decode + 2, temperature=0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    started: set[str] = set()
    while len(started) < len(prompts):
        started |= {out.request_id for out in engine.step() if out.token_ids}
    for _ in range(warmup):
        engine.step()
    clock, host, tokens = Clock(), time.thread_time(), 0
    for _ in range(decode):
        tokens += sum(1 for out in engine.step() if out.token_ids)
    wall, cpu = clock.read()
    host = time.thread_time() - host
    while engine.has_unfinished():
        engine.step()
    return Timed(wall, cpu, host, tokens, decode)


def mlx_lm_decode(
    model,
    prompts: list[list[int]],
    caches: list[list[Any]],
    cached: int,
    warmup: int,
    decode: int,
) -> Timed:
    """The same through mlx-lm's ``BatchGenerator``, each request's cache handed in filled with
    its first ``cached`` tokens and its prompt the tokens after them."""
    from mlx_lm.generate import BatchGenerator

    total = warmup + decode + 2
    gen = BatchGenerator(model, max_tokens=total, stop_tokens=None)
    uids = gen.insert([p[cached:] for p in prompts], [total] * len(prompts), caches=caches)
    started: set[int] = set()
    while len(started) < len(uids):
        started |= {r.uid for r in gen.next_generated()}
    for _ in range(warmup):
        gen.next_generated()
    clock, host, tokens = Clock(), time.thread_time(), 0
    for _ in range(decode):
        tokens += len(gen.next_generated())
    wall, cpu = clock.read()
    host = time.thread_time() - host
    gen.close()
    return Timed(wall, cpu, host, tokens, decode)


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


def decode_run(model, tokenizer, count: int, args: argparse.Namespace) -> None:
    """Decode tok/s of ``count`` requests at ``args.context`` tokens each, both sides on the
    same cached rows: mlx-lm's cache holds all but the last token's (its one-token prompt takes
    its decode path; its expanded prefill of a block at 16 x 16K segfaulted in OpenBLAS here),
    the engine's prefix cache the full blocks of them (it computes the rest, under 16 tokens)."""
    prompts = synthetic_prompts(count, args.context, args.context, 32000, seed=count)
    rows = latent_rows(count, args.context - 1, args.layers, seed=count)
    ours = peer = None
    if args.side in ("both", "macbatch"):
        ours = engine_decode(model, tokenizer, prompts, rows, count == args.requests[0], args)
        print(ours.line("macbatch"), flush=True)  # before mlx-lm's part, which may not finish
    if args.side != "macbatch" and not mlx_lm_attention_runs(count, args.context):
        print("  mlx-lm: not run (its CPU attention segfaults at this size)", flush=True)
    elif args.side in ("both", "mlx-lm"):
        caches = mlx_lm_caches(rows)
        peer = mlx_lm_decode(model, prompts, caches, args.context - 1, args.warmup, args.decode)
        print(peer.line("mlx-lm"), flush=True)
    if ours is not None and peer is not None:
        print_ratios(ours, peer, count, args.context)


def print_ratios(ours: Timed, peer: Timed, count: int, context: int) -> None:
    """Decode tok/s of both sides and their ratio, by wall and by CPU time."""
    for kind in ("wall", "cpu"):
        mine, theirs = ours.tokens / getattr(ours, kind), peer.tokens / getattr(peer, kind)
        print(
            f"decode, {count} request(s) at {context} tokens, {kind}: macbatch "
            f"{mine:.2f} tok/s, mlx-lm BatchGenerator {theirs:.2f} tok/s: x{mine / theirs:.2f}",
            flush=True,
        )


def engine_decode(
    model,
    tokenizer,
    prompts: list[list[int]],
    rows: list[mx.array],
    first: bool,
    args: argparse.Namespace,
) -> Timed:
    """The engine's side: a pool for the requests, their full blocks of ``rows`` filled, the
    decode timed; the engine closed after it (nothing of it in flight while mlx-lm's runs)."""
    block = 16
    cached = (args.context - 1) // block * block  # what the prefix cache serves
    steps = args.warmup + args.decode + 2
    config = EngineConfig(
        num_blocks=len(prompts) * (-(-(args.context + steps) // block) + 2),
        max_num_seqs=len(prompts),
        max_num_batched_tokens=2048,
        compile_decode_after=min(args.warmup, 64),
    )
    engine = Engine(model, tokenizer, config)
    if first:
        kv_bytes(engine)
    fill_engine(engine, prompts, [r[:, :cached] for r in rows])
    timed = macbatch_decode(engine, prompts, args.warmup, args.decode)
    engine.close()
    del engine
    mx.synchronize()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096, help="tokens per request")
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--decode", type=int, default=16, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps first")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=0, help="tokens; 0: skip that part")
    parser.add_argument("--side", choices=["both", "macbatch", "mlx-lm"], default="both")
    args = parser.parse_args()
    warn_without_openblas()
    GLM_4_7_FLASH["num_hidden_layers"] = args.layers
    model = build_bench_model(**GLM_4_7_FLASH)
    tokenizer = bench_tokenizer()
    if args.prefill:
        prefill_attention(model, args.prefill)
    for count in args.requests:
        decode_run(model, tokenizer, count, args)


if __name__ == "__main__":
    main()
