"""DeepSeek Sparse Attention test helpers: the lightning indexer's scores in float64 numpy (an
oracle of its own, from mlx-lm's formula: ``sum_h relu(q_h . k_t) * w_h``), to check that a
test's top-k selections are not decided by a tie (ReLU makes exact zeros common on random
weights, and a tie at the boundary leaves the selection to the sort), and the model with every
position attended (``index_topk`` past the context), which a sparse engine must not match."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import deepseek_v32

from tests.support.fp8_numpy import fp8_keys_numpy

# the smallest gap between the k-th and the (k+1)-th score, relative to the row's largest, that
# float32 summation-order differences cannot close
MIN_RELATIVE_GAP = 1e-5


def selection_gaps(model: nn.Module, tokens: list[int], fp8_keys: bool = False) -> list[float]:
    """For every layer and every row of ``tokens`` (one causal forward of mlx-lm's model) that
    sees more than ``index_topk`` positions: the gap between its k-th and (k+1)-th indexer score
    (float64), relative to its largest; ``fp8_keys``: over the keys rounded through the fp8
    format (``tests/support/fp8_numpy.py``)."""
    gaps: list[float] = []
    with _recorded_indexers(lambda *call: gaps.extend(_gaps(*call, fp8_keys))):
        mx.eval(model(mx.array([tokens])))
    return gaps


def selection_changes(model: nn.Module, tokens: list[int]) -> bool:
    """Whether rounding the indexer's keys through the fp8 format changes any row's top-k set
    over ``tokens`` (float64 scores; rows that see more than ``index_topk`` positions)."""
    changed: list[bool] = []

    def compare(indexer, x: mx.array, qr: mx.array) -> None:
        k = indexer.index_topk
        exact, rounded = (_scores(indexer, x, qr, fp8) for fp8 in (False, True))
        for row in range(k, exact.shape[0]):
            tops = [set(np.argsort(s[row, : row + 1])[-k:]) for s in (exact, rounded)]
            changed.append(tops[0] != tops[1])

    with _recorded_indexers(compare):
        mx.eval(model(mx.array([tokens])))
    return any(changed)


def assert_selection_untied(model: nn.Module, tokens: list[int], fp8_keys: bool = False) -> None:
    """Every top-k boundary of ``tokens`` clears ``MIN_RELATIVE_GAP`` (else the test's config or
    seed leaves a selection to a tie: a failure to fix in the test, not a flake)."""
    gaps = selection_gaps(model, tokens, fp8_keys)
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
def _recorded_indexers(record: Callable[..., None]) -> Iterator[None]:
    """Every uncached indexer call of the block also given to ``record(indexer, x, qr)``."""
    original = deepseek_v32.Indexer.__call__

    def recording(self, x, qr, mask, cache=None):
        if cache is None:
            record(self, x, qr)
        return original(self, x, qr, mask, cache)

    deepseek_v32.Indexer.__call__ = recording
    try:
        yield
    finally:
        deepseek_v32.Indexer.__call__ = original


def _scores(indexer, x: mx.array, qr: mx.array, fp8_keys: bool) -> np.ndarray:
    """The float64 scores ``[s, t]`` of one uncached causal call (batch of one)."""
    _, s, _ = x.shape
    heads, dim = indexer.n_heads, indexer.head_dim
    q = indexer.wq_b(qr).reshape(1, s, heads, dim).swapaxes(1, 2)
    keys = indexer.k_norm(indexer.wk(x)).reshape(1, 1, s, dim)
    q = np.array(indexer.rope(q), dtype=np.float64)[0]  # [H, s, D]
    keys = np.array(indexer.rope(keys), dtype=np.float64)[0, 0]  # [s, D]
    keys = fp8_keys_numpy(keys) if fp8_keys else keys
    w = np.array(indexer.weights_proj(x), dtype=np.float64)[0] * heads**-0.5 * dim**-0.5
    scores = np.einsum("hsd,td->hst", q, keys)
    return (np.maximum(scores, 0) * w.T[:, :, None]).sum(axis=0)


def _gaps(indexer, x: mx.array, qr: mx.array, fp8_keys: bool) -> list[float]:
    """One uncached call's boundary gaps (``selection_gaps``)."""
    scores = _scores(indexer, x, qr, fp8_keys)
    k, s = indexer.index_topk, scores.shape[0]
    gaps = []
    for row in range(k, s):  # row p sees p + 1 positions
        seen = np.sort(scores[row, : row + 1])[::-1]
        scale = max(abs(seen).max(), 1e-30)
        gaps.append(float((seen[k - 1] - seen[k]) / scale))
    return gaps


def assert_sparse_greedy(
    model: nn.Module, prompt: list[int], tokens: list[int], indexer_keys: str | None = None
) -> None:
    """``tokens`` are mlx-lm's greedy ones for ``prompt``, every selection on the way untied
    (checked first, so a tie fails with its own message rather than as a token mismatch);
    ``indexer_keys`` "fp8": mlx-lm's indexer keys rounded through the fp8 format."""
    from tests.support.oracle import mlx_lm_greedy

    fp8 = indexer_keys == "fp8"
    if len(prompt) + len(tokens) - 1 > model.args.index_topk:
        assert_selection_untied(model, prompt + tokens[:-1], fp8)
    assert tokens == mlx_lm_greedy(model, prompt, len(tokens), indexer_keys=indexer_keys)
