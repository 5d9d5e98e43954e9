"""gte, Nomic BERT, ModernBERT and DeBERTa-v2 in float64 numpy over one unpadded sequence, read
straight from the HF-named weights of ``encoder_families.py``'s checkpoints, written from
transformers' ``GteModel`` / ``NomicBertModel`` / ``ModernBertModel`` / ``DebertaV2Model`` math
(with their weight conversions from the published names): the oracle for macbatch's packed MLX
encoders.

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


def _deberta_bucket(relative: int, buckets: int, max_position: int) -> int:
    """``make_log_bucket_position`` of one i - j: itself within half of ``buckets``, else
    ceil(log(|r| / mid) / log((max - 1) / mid) * (mid - 1)) + mid with its sign."""
    mid = buckets // 2
    if buckets <= 0 or abs(relative) <= mid:
        return relative
    far = math.ceil(math.log(abs(relative) / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return int(math.copysign(far + mid, relative))


def deberta_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """``DebertaV2Model``: BERT's post-norm block, disentangled attention as
    ``DisentangledSelfAttention`` computes it (its gathers and the p2c transpose literally)."""
    w, eps, heads = (
        _float64(weights, "deberta."),
        config["layer_norm_eps"],
        config["num_attention_heads"],
    )
    length = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids]
    if config["position_biased_input"]:
        x = x + w["embeddings.position_embeddings.weight"][np.arange(length)]
    if config["type_vocab_size"]:
        x = x + w["embeddings.token_type_embeddings.weight"][types]
    if "embeddings.embed_proj.weight" in w:
        x = x @ w["embeddings.embed_proj.weight"].T
    x = _norm(x, w, "embeddings.LayerNorm", eps)
    buckets, max_rel = config["position_buckets"], config["max_relative_positions"]
    span = buckets if buckets > 0 else max_rel
    rel = w["encoder.rel_embeddings.weight"][: 2 * span]
    if config.get("norm_rel_ebd") == "layer_norm":
        rel = _norm(rel, w, "encoder.LayerNorm", eps)
    terms = config["pos_att_type"]
    terms = terms.split("|") if isinstance(terms, str) else terms
    rel_pos = np.array([[_deberta_bucket(i - j, buckets, max_rel) for j in range(length)]
                        for i in range(length)])  # fmt: skip
    dim = config["hidden_size"] // heads
    scale = np.sqrt(dim * (1 + len(terms)))
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}.attention"
        q, k, v = (
            _dense(x, w, f"{p}.self.{part}_proj").reshape(length, heads, dim).transpose(1, 0, 2)
            for part in ("query", "key", "value")
        )
        shared = config["share_att_key"]
        scores = q @ k.transpose(0, 2, 1) / scale
        if "c2p" in terms:
            pos_k = _dense(rel, w, f"{p}.self.{'key_proj' if shared else 'pos_key_proj'}")
            c2p = q @ pos_k.reshape(-1, heads, dim).transpose(1, 2, 0)  # [H, L, 2 span]
            c2p_pos = np.clip(rel_pos + span, 0, 2 * span - 1)
            scores = (
                scores
                + np.take_along_axis(c2p, np.broadcast_to(c2p_pos, (heads, length, length)), -1)
                / scale
            )
        if "p2c" in terms:
            pos_q = _dense(rel, w, f"{p}.self.{'query_proj' if shared else 'pos_query_proj'}")
            p2c = k @ pos_q.reshape(-1, heads, dim).transpose(1, 2, 0)  # [H, L (keys), 2 span]
            p2c_pos = np.clip(-rel_pos + span, 0, 2 * span - 1)
            gathered = np.take_along_axis(
                p2c, np.broadcast_to(p2c_pos, (heads, length, length)), -1
            )
            scores = scores + gathered.transpose(0, 2, 1) / scale
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(length, -1)
        x = _norm(x + _dense(context, w, f"{p}.output.dense"), w, f"{p}.output.LayerNorm", eps)
        up = _gelu(_dense(x, w, f"encoder.layer.{n}.intermediate.dense"))
        x = _norm(x + _dense(up, w, f"encoder.layer.{n}.output.dense"), w,
                  f"encoder.layer.{n}.output.LayerNorm", eps)  # fmt: skip
    return x


ORACLES = {"new": gte_hidden, "nomic_bert": nomic_hidden, "modernbert": modernbert_hidden,
           "deberta-v2": deberta_hidden}  # fmt: skip


def family_hidden(weights: dict, config: dict, ids: list[int], types: list[int]) -> np.ndarray:
    """The last layer's hidden states of one sequence, float64 [L, hidden]."""
    return ORACLES[config["model_type"]](weights, config, ids, types)
