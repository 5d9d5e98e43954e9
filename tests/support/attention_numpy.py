"""Float64 numpy varlen paged attention, written straight from the contract in DESIGN.md: one
query row at a time, so it shares no structure with the implementations it checks."""

from __future__ import annotations

import numpy as np


def paged_attention_numpy(
    q: np.ndarray,
    k_pages: np.ndarray,
    v_pages: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    selected: np.ndarray | None = None,
    rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """``selected [N, K]`` (sparse attention): row i sees only the positions its row lists
    (-1: no entry), among those the causal and window rule lets it see. ``rows`` (a second
    source: key pages, value pages, block table, ``[N, K2]`` lists): row i also sees every row
    its list names (-1: none), found through that table, in the same softmax."""
    q = q.astype(np.float64)
    k_pages = k_pages.astype(np.float64)
    v_pages = v_pages.astype(np.float64)
    n, hq, _ = q.shape
    hkv, block_size = k_pages.shape[1], k_pages.shape[2]
    out = np.zeros((n, hq, v_pages.shape[-1]))  # values may be narrower than keys (MLA)
    for s in range(len(seq_lens)):
        start, end = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        for i in range(start, end):
            pos = int(seq_lens[s]) - (end - start) + (i - start)
            first = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            keys_at = [
                t for t in range(first, pos + 1) if selected is None or t in set(selected[i])
            ]
            for h in range(hq):
                kv_head = h // (hq // hkv)
                k = np.stack(
                    [
                        k_pages[block_tables[s, t // block_size], kv_head, t % block_size]
                        for t in keys_at
                    ]
                )
                v = np.stack(
                    [
                        v_pages[block_tables[s, t // block_size], kv_head, t % block_size]
                        for t in keys_at
                    ]
                )
                if rows is not None:
                    row_k, row_v = _listed_rows(rows, s, i)
                    k, v = np.concatenate([k, row_k]), np.concatenate([v, row_v])
                logits = k @ q[i, h] * scale
                if softcap is not None:
                    logits = np.tanh(logits / softcap) * softcap
                peak = logits.max() if sinks is None else max(logits.max(), float(sinks[h]))
                weights = np.exp(logits - peak)
                denom = weights.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - peak))
                out[i, h] = weights @ v / denom
    return out


def _listed_rows(
    rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], seq: int, row: int
) -> tuple[np.ndarray, np.ndarray]:
    """The (keys, values) of the second-source rows query row ``row`` of ``seq`` lists."""
    keys, values, table, selected = rows
    per_block = keys.shape[2]
    listed = [int(r) for r in selected[row] if r >= 0]
    at = [(table[seq, r // per_block], 0, r % per_block) for r in listed]
    width_k, width_v = keys.shape[-1], values.shape[-1]
    return (
        np.array([keys[a] for a in at], dtype=np.float64).reshape(-1, width_k),
        np.array([values[a] for a in at], dtype=np.float64).reshape(-1, width_v),
    )


def random_paged_case(q_lens, ctx_lens, hq, hkv, d=16, block_size=4, seed=0):
    """Random pages and a shuffled (non-contiguous) block table for the given sequences."""
    rng = np.random.default_rng(seed)
    blocks_per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 3
    ids = rng.permutation(num_blocks)
    tables = np.zeros((len(ctx_lens), max(blocks_per_seq)), dtype=np.int32)
    used = 0
    for s, nb in enumerate(blocks_per_seq):
        tables[s, :nb] = ids[used : used + nb]
        used += nb
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), hq, d)).astype(np.float32)
    k = rng.standard_normal((num_blocks, hkv, block_size, d)).astype(np.float32)
    v = rng.standard_normal((num_blocks, hkv, block_size, d)).astype(np.float32)
    return q, k, v, tables, np.array(ctx_lens, dtype=np.int32), cu


def quantize_numpy(x: np.ndarray, bits: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The page format of ``macbatch/metal/quant.py`` written from its docstring, element by
    element in numpy: (codes uint8 [..., D * bits / 8], scales float16 [..., D / g, 2])."""
    levels = 2**bits - 1
    groups = np.clip(x.astype(np.float32), -65504, 65504)
    groups = groups.reshape(*x.shape[:-1], -1, group_size)
    lo, hi = groups.min(axis=-1), groups.max(axis=-1)
    scale = ((hi - lo) / np.float32(levels)).astype(np.float16)
    bias = lo.astype(np.float16)
    s32, b32 = scale.astype(np.float32)[..., None], bias.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s32 > 0, np.rint((groups - b32) / s32), 0)
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(x.shape)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes, np.stack([scale, bias], axis=-1)


def dequantize_numpy(codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """Float64 values of quantized pages: code * scale + bias per group."""
    if bits == 4:
        codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    groups = scales.shape[-2]
    values = codes.astype(np.float64).reshape(*codes.shape[:-1], groups, -1)
    scales = scales.astype(np.float64)
    return (values * scales[..., 0:1] + scales[..., 1:2]).reshape(codes.shape)


# Query and sequence lengths per case: decode, prefill, chunks after a cached prefix, mixed.
CASES = {
    "decode": ([1, 1, 1], [1, 9, 17]),
    "prefill": ([7, 12], [7, 12]),
    "prefill_chunk_after_cache": ([5], [13]),
    "mixed": ([1, 6, 1, 3], [10, 6, 4, 11]),
    "many_sequences": ([1] * 6 + [2, 3, 1, 4], [3, 5, 8, 13, 1, 2, 9, 4, 7, 12]),
}
