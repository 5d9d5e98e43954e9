"""BGE-M3's two outputs beside its dense vector (FlagEmbedding's BGEM3Model, as published):
sparse lexical weights, ReLU(sparse_linear(hidden)) of each token with the highest weight per
token id, special tokens left out; and ColBERT vectors, colbert_linear(hidden) of every token
but the first (CLS), each L2-normalized. The heads are ``sparse_linear.pt`` and
``colbert_linear.pt`` beside the weights."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.encoder.torch_file import read_torch_state_dict

SPARSE_FILE, COLBERT_FILE = "sparse_linear.pt", "colbert_linear.pt"


def _linear(path: Path) -> nn.Linear:
    state = read_torch_state_dict(path)
    out_dim, in_dim = state["weight"].shape
    layer = nn.Linear(in_dim, out_dim)
    layer.load_weights([(k, mx.array(v)) for k, v in state.items()])
    return layer


class M3Heads(nn.Module):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.sparse = _linear(directory / SPARSE_FILE)
        self.colbert = _linear(directory / COLBERT_FILE)

    @staticmethod
    def present(directory: Path) -> bool:
        return (directory / SPARSE_FILE).exists() and (directory / COLBERT_FILE).exists()

    def lexical_weights(
        self, rows: mx.array, ids: tuple[int, ...], special: frozenset[int]
    ) -> dict[int, float]:
        """One sequence's rows [L, hidden] -> token id -> its highest weight (those above 0)."""
        weights = np.array(nn.relu(self.sparse(rows.astype(mx.float32)))[:, 0])
        out: dict[int, float] = {}
        for token, weight in zip(ids, weights.tolist()):
            if token not in special and weight > out.get(token, 0.0):
                out[token] = weight
        return out

    def colbert_vectors(self, rows: mx.array) -> np.ndarray:
        """One sequence's rows [L, hidden] -> [L - 1, D] normalized, CLS dropped."""
        vectors = self.colbert(rows[1:].astype(mx.float32))
        return np.array(vectors / mx.linalg.norm(vectors, axis=-1, keepdims=True))
