"""Tiny random checkpoints of the rotary encoder families in the Hugging Face layout their
published checkpoints have: gte (Alibaba's ``NewModel``, as gte-base-en-v1.5 and
gte-multilingual-base ship it), Nomic BERT (nomic-embed-text-v1.5's GPT-2-style config and
``Wqkv`` / ``fc11`` names) and ModernBERT (answerdotai/ModernBERT-base's ``ModernBertForMaskedLM``
with its MLM head, or a bare ``ModernBertModel`` as gte-modernbert ships it), with real-format
tokenizers (``encoder_checkpoints.py``; ModernBERT's byte-level BPE in
``tokenizers/modernbert-bpe``), and DeBERTa-v2 / v3 (``DebertaV2ForMaskedLM``'s names under
``deberta.``, with BERT's WordPiece standing in for its SentencePiece: the same
``[CLS] A [SEP]`` template)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.support.encoder_checkpoints import (
    TOKENIZERS,
    VOCAB,
    unigram_tokenizer,
    wordpiece_tokenizer,
)

H, HEADS, INTER = 64, 4, 96


def gte_config(multilingual: bool = False) -> dict:
    """gte-base-en-v1.5's switches (NTK-scaled RoPE, no token types), or
    gte-multilingual-base's (plain RoPE, one token type)."""
    config = {
        "architectures": ["NewModel"], "model_type": "new", "vocab_size": VOCAB,
        "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": HEADS,
        "intermediate_size": INTER, "hidden_act": "gelu", "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-12, "layer_norm_type": "layer_norm",
        "position_embedding_type": "rope", "pack_qkv": True, "unpad_inputs": False,
        "logn_attention_scale": False, "logn_attention_clip1": False,
    }  # fmt: skip
    if multilingual:
        return config | {"rope_theta": 160000, "rope_scaling": None, "type_vocab_size": 1,
                         "pad_token_id": 1}  # fmt: skip
    return config | {"rope_theta": 500000, "rope_scaling": {"type": "ntk", "factor": 2.0},
                     "type_vocab_size": 0, "pad_token_id": 0}  # fmt: skip


def nomic_config() -> dict:
    return {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": VOCAB,
        "n_embd": H, "n_layer": 2, "n_head": HEADS, "n_inner": INTER, "n_positions": 8192,
        "max_trained_positions": 2048, "activation_function": "swiglu",
        "layer_norm_epsilon": 1e-12, "type_vocab_size": 2, "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False, "use_rms_norm": False, "causal": False,
    }  # fmt: skip


def modernbert_config(biases: bool = False, masked_lm: bool = True) -> dict:
    """Four layers, global every third (0 and 3), local ones seeing 8 positions either way."""
    return {
        "architectures": ["ModernBertForMaskedLM" if masked_lm else "ModernBertModel"],
        "model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": H,
        "intermediate_size": INTER, "num_hidden_layers": 4, "num_attention_heads": HEADS,
        "hidden_activation": "gelu", "global_attn_every_n_layers": 3, "local_attention": 16,
        "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
        "max_position_embeddings": 8192, "norm_eps": 1e-5, "norm_bias": biases,
        "attention_bias": biases, "mlp_bias": biases, "pad_token_id": 4, "cls_token_id": 2,
        "sep_token_id": 3, "classifier_pooling": "mean",
    }  # fmt: skip


def deberta_config(v3: bool = True) -> dict:
    """deberta-v3's switches (shared key projections, both terms, LayerNorm'd relative
    embeddings, no absolute positions or token types), with 32 log buckets to 128 so short
    texts reach past them; or the other branches: own ``pos_key_proj``, content-to-position
    only, positions clipped to 64 without buckets, absolute positions, two token types, 32-wide
    embeddings projected up."""
    config = {
        "architectures": ["DebertaV2ForMaskedLM"], "model_type": "deberta-v2",
        "vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "intermediate_size": INTER, "hidden_act": "gelu",
        "max_position_embeddings": 512, "layer_norm_eps": 1e-7, "relative_attention": True,
        "pad_token_id": 0,
    }  # fmt: skip
    if v3:
        return config | {"position_buckets": 32, "max_relative_positions": 128,
                         "norm_rel_ebd": "layer_norm", "share_att_key": True,
                         "pos_att_type": "p2c|c2p", "position_biased_input": False,
                         "type_vocab_size": 0}  # fmt: skip
    return config | {"position_buckets": -1, "max_relative_positions": 64,
                     "share_att_key": False, "pos_att_type": ["c2p"],
                     "position_biased_input": True, "type_vocab_size": 2,
                     "embedding_size": 32, "architectures": ["DebertaV2Model"]}  # fmt: skip


class _Weights:
    """HF-named float32 random weights, LayerNorm scales near 1."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.w: dict[str, np.ndarray] = {}

    def mat(self, *shape: int, scale: float = 0.1) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def linear(self, name: str, out: int, inp: int, bias: bool) -> None:
        self.w[f"{name}.weight"] = self.mat(out, inp)
        if bias:
            self.w[f"{name}.bias"] = self.mat(out)

    def norm(self, name: str, bias: bool = True) -> None:
        self.w[f"{name}.weight"] = 1 + self.mat(H)
        if bias:
            self.w[f"{name}.bias"] = self.mat(H)


def gte_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    r = _Weights(seed)
    r.w["embeddings.word_embeddings.weight"] = r.mat(VOCAB, H, scale=1.0)
    if config["type_vocab_size"]:
        r.w["embeddings.token_type_embeddings.weight"] = r.mat(config["type_vocab_size"], H)
    r.norm("embeddings.LayerNorm")
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}"
        r.linear(f"{p}.attention.qkv_proj", 3 * H, H, bias=True)
        r.linear(f"{p}.attention.o_proj", H, H, bias=True)
        r.norm(f"{p}.attn_ln")
        r.linear(f"{p}.mlp.up_gate_proj", 2 * INTER, H, bias=False)
        r.linear(f"{p}.mlp.down_proj", H, INTER, bias=True)
        r.norm(f"{p}.mlp_ln")
    return r.w


def nomic_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    r = _Weights(seed)
    r.w["embeddings.word_embeddings.weight"] = r.mat(VOCAB, H, scale=1.0)
    r.w["embeddings.token_type_embeddings.weight"] = r.mat(2, H, scale=0.5)
    r.norm("emb_ln")
    for n in range(config["n_layer"]):
        p = f"encoder.layers.{n}"
        r.linear(f"{p}.attn.Wqkv", 3 * H, H, bias=False)
        r.linear(f"{p}.attn.out_proj", H, H, bias=False)
        r.linear(f"{p}.mlp.fc11", INTER, H, bias=False)
        r.linear(f"{p}.mlp.fc12", INTER, H, bias=False)
        r.linear(f"{p}.mlp.fc2", H, INTER, bias=False)
        r.norm(f"{p}.norm1")
        r.norm(f"{p}.norm2")
    return r.w


def modernbert_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Under ``model.`` with the MLM head (``head.``, ``decoder.``) when the config is a
    ``ModernBertForMaskedLM``'s."""
    bias = config["attention_bias"]
    r = _Weights(seed)
    r.w["embeddings.tok_embeddings.weight"] = r.mat(VOCAB, H, scale=1.0)
    r.norm("embeddings.norm", bias)
    for n in range(config["num_hidden_layers"]):
        p = f"layers.{n}"
        if n:
            r.norm(f"{p}.attn_norm", bias)
        r.linear(f"{p}.attn.Wqkv", 3 * H, H, bias)
        r.linear(f"{p}.attn.Wo", H, H, bias)
        r.norm(f"{p}.mlp_norm", bias)
        r.linear(f"{p}.mlp.Wi", 2 * INTER, H, bias)
        r.linear(f"{p}.mlp.Wo", H, INTER, bias)
    r.norm("final_norm", bias)
    if config["architectures"][0] != "ModernBertForMaskedLM":
        return r.w
    weights = {f"model.{k}": v for k, v in r.w.items()}
    r.w = {}
    r.linear("head.dense", H, H, bias)
    r.norm("head.norm", bias)
    r.w["decoder.bias"] = r.mat(VOCAB)
    return weights | r.w


def deberta_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Under ``deberta.`` with an MLM head when the config is a ``DebertaV2ForMaskedLM``'s."""
    r = _Weights(seed)
    size = config.get("embedding_size", H)
    r.w["embeddings.word_embeddings.weight"] = r.mat(VOCAB, size, scale=1.0)
    if config["position_biased_input"]:
        r.w["embeddings.position_embeddings.weight"] = r.mat(512, size, scale=0.5)
    if config["type_vocab_size"]:
        r.w["embeddings.token_type_embeddings.weight"] = r.mat(2, size, scale=0.5)
    if size != H:
        r.linear("embeddings.embed_proj", H, size, bias=False)
    r.norm("embeddings.LayerNorm")
    span = (
        config["position_buckets"]
        if config["position_buckets"] > 0
        else config["max_relative_positions"]
    )
    r.w["encoder.rel_embeddings.weight"] = r.mat(2 * span, H, scale=1.0)
    if config.get("norm_rel_ebd") == "layer_norm":
        r.norm("encoder.LayerNorm")
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}.attention"
        for part in ("query_proj", "key_proj", "value_proj"):
            r.linear(f"{p}.self.{part}", H, H, bias=True)
        if not config["share_att_key"]:
            r.linear(f"{p}.self.pos_key_proj", H, H, bias=True)
        r.linear(f"{p}.output.dense", H, H, bias=True)
        r.norm(f"{p}.output.LayerNorm")
        r.linear(f"encoder.layer.{n}.intermediate.dense", INTER, H, bias=True)
        r.linear(f"encoder.layer.{n}.output.dense", H, INTER, bias=True)
        r.norm(f"encoder.layer.{n}.output.LayerNorm")
    if config["architectures"][0] != "DebertaV2ForMaskedLM":
        return r.w
    weights = {f"deberta.{k}": v for k, v in r.w.items()}
    return weights | {"lm_predictions.lm_head.bias": r.mat(VOCAB)}


def modernbert_tokenizer() -> str:
    return (TOKENIZERS / "modernbert-bpe" / "tokenizer.json").read_text()


_WEIGHTS: dict[str, Callable[[dict], dict[str, np.ndarray]]] = {
    "new": gte_weights, "nomic_bert": nomic_weights, "modernbert": modernbert_weights,
    "deberta-v2": deberta_weights,
}  # fmt: skip


def write_family(path: Path, config: dict) -> tuple[Path, dict[str, np.ndarray], dict]:
    """The checkpoint directory, its HF-named weights and its config; gte-multilingual's
    tokenizer is XLM-R's Unigram, the others' BERT's WordPiece or ModernBERT's BPE."""
    path.mkdir(parents=True, exist_ok=True)
    weights = _WEIGHTS[config["model_type"]](config)
    save_file(weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    if config["model_type"] == "modernbert":
        tokenizer = modernbert_tokenizer()
    elif config.get("type_vocab_size") == 1:
        tokenizer = unigram_tokenizer()
    else:
        tokenizer = wordpiece_tokenizer()
    (path / "tokenizer.json").write_text(tokenizer)
    return path, weights, config
