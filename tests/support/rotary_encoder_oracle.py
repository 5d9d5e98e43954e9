"""gte, Nomic BERT and ModernBERT in float64 numpy over one unpadded sequence, read straight from
the HF-named weights of ``encoder_families.py``'s checkpoints, written from transformers'
``GteModel`` / ``NomicBertModel`` / ``ModernBertModel`` math (with their weight conversions from
the published names): the oracle for macbatch's packed MLX encoders.

RoPE here is the complex rotation of each (x_i, x_{i + D/2}) pair by position * frequency;
ModernBERT's local layers mask the keys farther than ``local_attention // 2`` positions."""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    out = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * w[f"{name}.weight"]
    return out + w.get(f"{name}.bias", 0.0)


def _dense(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0.0)


def _rope(x: np.ndarray, theta: float, ntk: float = 1.0) -> np.ndarray:
    """``x`` [L, H, D] with row i turned by angle i * f_k on pair k (f_k = base^(-2k/D); NTK:
    base * ntk and f_k / ntk^(2/D), gte's fixed scaling)."""
    length, _, dim = x.shape
    freqs = (theta * ntk) ** (-np.arange(dim // 2) * 2.0 / dim) / ntk ** (2.0 / dim)
    turn = np.exp(1j * np.arange(length)[:, None, None] * freqs)
    pairs = (x[..., : dim // 2] + 1j * x[..., dim // 2 :]) * turn
    return np.concatenate([pairs.real, pairs.imag], axis=-1)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None) -> np.ndarray:
    length, heads, dim = q.shape
    scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(dim)
    if window is not None:
        far = np.abs(np.arange(length)[:, None] - np.arange(length)[None]) > window
        scores = np.where(far, -np.inf, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", probs, v).reshape(length, heads * dim)


def _heads(qkv: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = np.split(qkv, 3, axis=-1)
    return tuple(t.reshape(len(t), heads, -1) for t in (q, k, v))  # type: ignore[return-value]


def _float64(weights: dict, prefix: str = "") -> dict:
    return {k.removeprefix(prefix): np.asarray(v, np.float64) for k, v in weights.items()}


def gte_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """``NewModel``: post-norm blocks, QKV packed, ``up_gate_proj`` = [up; gate]."""
    w, eps, heads = (
        _float64(weights, "new."),
        config["layer_norm_eps"],
        config["num_attention_heads"],
    )
    scaling = config.get("rope_scaling") or {}
    theta, ntk = config["rope_theta"], scaling.get("factor", 1.0)
    x = w["embeddings.word_embeddings.weight"][ids]
    if config["type_vocab_size"]:
        x = x + w["embeddings.token_type_embeddings.weight"][types]
    x = _norm(x, w, "embeddings.LayerNorm", eps)
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}"
        q, k, v = _heads(_dense(x, w, f"{p}.attention.qkv_proj"), heads)
        context = _attention(_rope(q, theta, ntk), _rope(k, theta, ntk), v, None)
        x = _norm(x + _dense(context, w, f"{p}.attention.o_proj"), w, f"{p}.attn_ln", eps)
        up, gate = np.split(_dense(x, w, f"{p}.mlp.up_gate_proj"), 2, axis=-1)
        x = _norm(x + _dense(_gelu(gate) * up, w, f"{p}.mlp.down_proj"), w, f"{p}.mlp_ln", eps)
    return x


def nomic_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """``NomicBertModel``: post-norm blocks, no biases, SwiGLU ``fc2(fc11(x) * silu(fc12(x)))``."""
    w, eps, heads = _float64(weights), config["layer_norm_epsilon"], config["n_head"]
    theta = config["rotary_emb_base"]
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.token_type_embeddings.weight"][types]
    )
    x = _norm(x, w, "emb_ln", eps)
    for n in range(config["n_layer"]):
        p = f"encoder.layers.{n}"
        q, k, v = _heads(_dense(x, w, f"{p}.attn.Wqkv"), heads)
        context = _attention(_rope(q, theta), _rope(k, theta), v, None)
        x = _norm(x + _dense(context, w, f"{p}.attn.out_proj"), w, f"{p}.norm1", eps)
        gated = _dense(x, w, f"{p}.mlp.fc11") * _silu(_dense(x, w, f"{p}.mlp.fc12"))
        x = _norm(x + _dense(gated, w, f"{p}.mlp.fc2"), w, f"{p}.norm2", eps)
    return x


def modernbert_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """``ModernBertModel``: pre-norm (layer 0's attention reads the embeddings' norm), global
    layers every ``global_attn_every_n_layers`` from 0 under ``global_rope_theta``, the others
    local under ``local_rope_theta``, GeGLU ``Wo(gelu(input) * gate)``, a final norm."""
    w, eps, heads = _float64(weights, "model."), config["norm_eps"], config["num_attention_heads"]
    x = _norm(w["embeddings.tok_embeddings.weight"][ids], w, "embeddings.norm", eps)
    for n in range(config["num_hidden_layers"]):
        p = f"layers.{n}"
        local = n % config["global_attn_every_n_layers"] != 0
        theta = config["local_rope_theta" if local else "global_rope_theta"]
        window = config["local_attention"] // 2 if local else None
        q, k, v = _heads(
            _dense(_norm(x, w, f"{p}.attn_norm", eps) if n else x, w, f"{p}.attn.Wqkv"), heads
        )
        x = x + _dense(_attention(_rope(q, theta), _rope(k, theta), v, window), w, f"{p}.attn.Wo")
        inp, gate = np.split(
            _dense(_norm(x, w, f"{p}.mlp_norm", eps), w, f"{p}.mlp.Wi"), 2, axis=-1
        )
        x = x + _dense(_gelu(inp) * gate, w, f"{p}.mlp.Wo")
    return _norm(x, w, "final_norm", eps)


ORACLES = {"new": gte_hidden, "nomic_bert": nomic_hidden, "modernbert": modernbert_hidden}


def family_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """The last layer's hidden states of one sequence, float64 [L, hidden]."""
    return ORACLES[config["model_type"]](weights, config, ids, types)
