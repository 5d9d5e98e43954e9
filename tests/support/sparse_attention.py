"""DeepSeek Sparse Attention test helpers: the lightning indexer's scores in float64 numpy (an
oracle of its own, from mlx-lm's formula: ``sum_h relu(q_h . k_t) * w_h``), to check that a
test's top-k selections are not decided by a tie (ReLU makes exact zeros common on random
weights, and a tie at the boundary leaves the selection to the sort), and the model with every
position attended (``index_topk`` past the context), which a sparse engine must not match."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import deepseek_v32

# the smallest gap between the k-th and the (k+1)-th score, relative to the row's largest, that
# float32 summation-order differences cannot close
MIN_RELATIVE_GAP = 1e-5


def selection_gaps(model: nn.Module, tokens: list[int]) -> list[float]:
    """For every layer and every row of ``tokens`` (one causal forward of mlx-lm's model) that
    sees more than ``index_topk`` positions: the gap between its k-th and (k+1)-th indexer score
    (float64), relative to its largest."""
    gaps: list[float] = []
    with _recorded_indexers(gaps):
        mx.eval(model(mx.array([tokens])))
    return gaps


def assert_selection_untied(model: nn.Module, tokens: list[int]) -> None:
    """Every top-k boundary of ``tokens`` clears ``MIN_RELATIVE_GAP`` (else the test's config or
    seed leaves a selection to a tie: a failure to fix in the test, not a flake)."""
    gaps = selection_gaps(model, tokens)
    assert gaps, "no row saw more than index_topk positions: nothing was selected"
    tied = sum(g < MIN_RELATIVE_GAP for g in gaps)
    assert not tied, f"{tied} of {len(gaps)} top-k boundaries tied (smallest {min(gaps):.2e})"


def dense_copy(model: nn.Module) -> nn.Module:
    """The same weights with every position attended: each indexer's top-k past any context."""
    dense = copy.deepcopy(model)
    for layer in dense.model.layers:
        layer.self_attn.indexer.index_topk = 1 << 30
    return dense


@contextmanager
def _recorded_indexers(gaps: list[float]) -> Iterator[None]:
    original = deepseek_v32.Indexer.__call__

    def recording(self, x, qr, mask, cache=None):
        if cache is None:
            gaps.extend(_gaps(self, x, qr))
        return original(self, x, qr, mask, cache)

    deepseek_v32.Indexer.__call__ = recording
    try:
        yield
    finally:
        deepseek_v32.Indexer.__call__ = original


def _gaps(indexer, x: mx.array, qr: mx.array) -> list[float]:
    """The float64 scores of one uncached causal call (batch of one) and their boundary gaps."""
    _, s, _ = x.shape
    heads, dim, k = indexer.n_heads, indexer.head_dim, indexer.index_topk
    q = indexer.wq_b(qr).reshape(1, s, heads, dim).swapaxes(1, 2)
    keys = indexer.k_norm(indexer.wk(x)).reshape(1, 1, s, dim)
    q = np.array(indexer.rope(q), dtype=np.float64)[0]  # [H, s, D]
    keys = np.array(indexer.rope(keys), dtype=np.float64)[0, 0]  # [s, D]
    w = np.array(indexer.weights_proj(x), dtype=np.float64)[0] * heads**-0.5 * dim**-0.5
    scores = np.einsum("hsd,td->hst", q, keys)
    scores = (np.maximum(scores, 0) * w.T[:, :, None]).sum(axis=0)  # [s, t]
    gaps = []
    for row in range(k, s):  # row p sees p + 1 positions
        seen = np.sort(scores[row, : row + 1])[::-1]
        scale = max(abs(seen).max(), 1e-30)
        gaps.append(float((seen[k - 1] - seen[k]) / scale))
    return gaps


def assert_sparse_greedy(model: nn.Module, prompt: list[int], tokens: list[int]) -> None:
    """``tokens`` are mlx-lm's greedy ones for ``prompt``, every selection on the way untied
    (checked first, so a tie fails with its own message rather than as a token mismatch)."""
    from tests.support.oracle import mlx_lm_greedy

    if len(prompt) + len(tokens) - 1 > model.args.index_topk:
        assert_selection_untied(model, prompt + tokens[:-1])
    assert tokens == mlx_lm_greedy(model, prompt, len(tokens))
