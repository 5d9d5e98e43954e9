"""The BERT / RoBERTa / XLM-RoBERTa encoder in float64 numpy, written from the architecture
(Devlin et al. 2019; HF's ``BertModel``: post-LayerNorm blocks, exact GELU; RoBERTa's position
ids from padding_idx + 1) over one unpadded sequence, read straight from the HF-named weights:
the oracle for macbatch's packed MLX encoder. With ELECTRA's ``embeddings_project`` and MPNet's
relative-position bias (HF's ``MPNetEncoder.compute_position_bias``) when the weights hold
them."""

from __future__ import annotations

import math

import numpy as np

from tests.support.encoder_head_oracle import head_logits

_erf = np.vectorize(math.erf)


def _layer_norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def _base(weights: dict, config: dict) -> dict[str, np.ndarray]:
    prefix = "bert." if config["model_type"] == "bert" else "roberta."
    return {
        k.removeprefix(prefix): np.asarray(v, np.float64)
        for k, v in weights.items()
        if not k.startswith("classifier")
    }


def _mpnet_bucket(query: int, key: int) -> int:
    """MPNet's ``relative_position_bucket`` of one pair (32 buckets, max distance 128)."""
    n = query - key
    bucket = 16 if n < 0 else 0
    n = abs(n)
    if n < 8:
        return bucket + n
    return bucket + min(15, 8 + int(math.log(n / 8) / math.log(128 / 8) * 8))


def _relative_bias(w: dict, length: int) -> np.ndarray | float:
    """[heads, L, L] MPNet's bias on the scores (0 for the other families)."""
    table = w.get("encoder.relative_attention_bias.weight")
    if table is None:
        return 0.0
    buckets = [[_mpnet_bucket(i, j) for j in range(length)] for i in range(length)]
    return table[np.array(buckets)].transpose(2, 0, 1)


def oracle_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """The last layer's hidden states of one sequence, float64 [L, hidden]."""
    w = _base(weights, config)
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    start = config["pad_token_id"] + 1 if config["model_type"] not in ("bert", "electra") else 0
    positions = start + np.arange(len(ids))
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][positions]
        + w["embeddings.token_type_embeddings.weight"][types]
    )
    x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    if "embeddings_project.weight" in w:
        x = _linear(x, w, "embeddings_project")
    length, hidden = x.shape
    dim = hidden // heads
    bias = _relative_bias(w, length)
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}"
        q, k, v = (
            _linear(x, w, f"{p}.attention.self.{part}").reshape(length, heads, dim)
            for part in ("query", "key", "value")
        )
        scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(dim) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("hij,jhd->ihd", probs, v).reshape(length, hidden)
        x = _layer_norm(x + _linear(context, w, f"{p}.attention.output.dense"), w,
                        f"{p}.attention.output.LayerNorm", eps)  # fmt: skip
        up = _linear(x, w, f"{p}.intermediate.dense")
        up = 0.5 * up * (1 + _erf(up / np.sqrt(2)))
        x = _layer_norm(x + _linear(up, w, f"{p}.output.dense"), w, f"{p}.output.LayerNorm", eps)
    return x


def oracle_pooled(hidden: np.ndarray, method: str, normalize: bool) -> np.ndarray:
    vector = {"cls": hidden[0], "mean": hidden.mean(0), "last": hidden[-1]}[method]
    return vector / np.linalg.norm(vector) if normalize else vector


def oracle_score(weights: dict, config: dict, ids: list[int], types: list[int]) -> float:
    """A one-label sequence classifier's sigmoid(logit): its head (``encoder_head_oracle.py``)
    over the last hidden states."""
    logit = head_logits(weights, config, oracle_hidden(weights, config, ids, types))[0]
    return float(1 / (1 + np.exp(-logit)))


def oracle_lexical(hidden: np.ndarray, ids: list[int], sparse: dict, special: set) -> dict:
    """BGE-M3's sparse weights from the float64 rows: relu(linear) per token, max per id."""
    weights = np.maximum(hidden @ sparse["weight"].astype(np.float64).T + sparse["bias"], 0)[:, 0]
    out: dict[int, float] = {}
    for token, weight in zip(ids, weights):
        if token not in special and weight > out.get(token, 0.0):
            out[token] = float(weight)
    return out


def oracle_colbert(hidden: np.ndarray, colbert: dict) -> np.ndarray:
    vectors = hidden[1:] @ colbert["weight"].astype(np.float64).T + colbert["bias"]
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def oracle_embedding(
    weights: dict, config: dict, ids: list[int], method: str, normalize: bool,
    dimensions: int | None = None,
) -> np.ndarray:  # fmt: skip
    """One text's vector: pooled, cut to ``dimensions``, then normalized (token types 0)."""
    vector = oracle_pooled(oracle_hidden(weights, config, ids, [0] * len(ids)), method, False)
    vector = vector[:dimensions] if dimensions else vector
    return vector / np.linalg.norm(vector) if normalize else vector


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
