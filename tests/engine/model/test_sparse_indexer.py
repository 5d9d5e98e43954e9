"""The lightning indexer's selection over paged keys (``model/sparse_indexer.py``) against a
float64 numpy oracle: a step mixing a prefill chunk past the top-k, a decode and a chunk that
sees fewer positions than k, its keys in shuffled blocks, cut into one-row tiles and whole."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine.model.sparse_indexer import IndexerRows, SelectionPlan, select
from macbatch.metal import AttentionMetadata

TOP_K, HEADS, DIM, BLOCK = 12, 16, 16, 8
# (context length, rows this step): a chunk at 25..39, a decode at 24, a first chunk of 9
SEQUENCES = [(40, 15), (25, 1), (9, 9)]


def _step(seed: int):
    rng = np.random.default_rng(seed)
    lens = np.array([n for n, _ in SEQUENCES])
    q_lens = np.array([q for _, q in SEQUENCES])
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    width = -(-lens.max() // BLOCK)
    ids = rng.permutation(len(SEQUENCES) * width).reshape(len(SEQUENCES), width)
    pages = np.zeros((ids.size, 1, BLOCK, DIM), np.float32)
    keys = [rng.standard_normal((n, DIM)).astype(np.float32) for n in lens]
    for s, seq_keys in enumerate(keys):
        for t, key in enumerate(seq_keys):
            pages[ids[s, t // BLOCK], 0, t % BLOCK] = key
    n = int(cu[-1])
    queries = rng.standard_normal((n, HEADS, DIM)).astype(np.float32)
    weights = rng.standard_normal((n, HEADS)).astype(np.float32)  # signed: scores are too
    meta = AttentionMetadata.build(mx.array(ids.astype(np.int32)), lens, cu)
    rows = IndexerRows(
        mx.array(queries), mx.array(np.zeros((n, DIM), np.float32)), mx.array(weights)
    )
    return rows, mx.array(pages), meta, keys, queries, weights, lens, cu


def _expected(keys, queries, weights, lens, cu) -> list[set[int]]:
    """Each row's top-k of the positions it sees (all of them when it sees k or fewer)."""
    wanted = []
    for s in range(len(lens)):
        first = lens[s] - (cu[s + 1] - cu[s])
        for row in range(cu[s], cu[s + 1]):
            seen = keys[s][: first + row - cu[s] + 1].astype(np.float64)
            scores = np.maximum(queries[row].astype(np.float64) @ seen.T, 0)
            scores = (scores * weights[row, :, None]).sum(axis=0)
            order = np.argsort(-scores)
            if len(order) > TOP_K:
                gap = scores[order[TOP_K - 1]] - scores[order[TOP_K]]
                assert gap > 1e-5 * abs(scores).max(), f"row {row}: tied at the boundary"
            wanted.append(set(order[:TOP_K].tolist()))
    return wanted


@pytest.mark.parametrize("tile_scores", [1, 1 << 27], ids=["one-row tiles", "one tile"])
def test_each_row_gets_the_top_k_of_what_it_sees(tile_scores):
    rows, pages, meta, keys, queries, weights, lens, cu = _step(seed=3)
    plan = SelectionPlan(meta, TOP_K, HEADS, BLOCK, tile_scores)
    got = np.array(select(rows, pages, plan))
    assert got.shape == (int(cu[-1]), TOP_K)
    for row, (picked, want) in enumerate(zip(got, _expected(keys, queries, weights, lens, cu))):
        listed = picked[picked >= 0].tolist()
        assert len(listed) == len(set(listed)), f"row {row}: a position twice"
        assert set(listed) == want, f"row {row}"
        assert (picked[picked < 0] == -1).all(), f"row {row}: an unused entry is not -1"


def test_a_step_within_the_top_k_is_dense():
    """No sequence past k keys: no selection (mlx-lm's indexer returns None there)."""
    rows, pages, _, *_ = _step(seed=3)
    small = AttentionMetadata.build(mx.zeros((1, 2), mx.int32), np.array([TOP_K]), np.array([0, 1]))
    assert select(rows, pages, SelectionPlan(small, TOP_K, HEADS, BLOCK)) is None
