"""Tiny random encoder checkpoints in the Hugging Face layout (``BertModel`` /
``XLMRobertaModel`` config fields and weight names, with or without the ``bert.`` / ``roberta.``
prefix a task checkpoint has, and the classification heads), with real tokenizers.

No BERT or XLM-R tokenizer is cached on this machine and the hub is unreachable, so the
tokenizers were trained with the ``tokenizers`` library's own trainers (the real algorithms:
BERT's WordPiece with its normalizer, pre-tokenizer and ``[CLS] A [SEP] B [SEP]`` template;
XLM-R's SentencePiece Unigram with Metaspace and ``<s> A </s></s> B </s>``) on the project's
docs/*.md, a real English corpus, by ``scripts/train_encoder_tokenizers.py``, and vendored in
``tests/support/tokenizers/`` (training the Unigram took ~18 s in every test process).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

DOCS = Path(__file__).parents[2] / "docs"
VOCAB = 1500


TOKENIZERS = Path(__file__).parent / "tokenizers"


@cache
def wordpiece_tokenizer() -> str:
    """A BERT WordPiece tokenizer.json (uncased), as a JSON string."""
    return (TOKENIZERS / "bert-wordpiece" / "tokenizer.json").read_text()


@cache
def unigram_tokenizer() -> str:
    """An XLM-R SentencePiece-Unigram tokenizer.json, as a JSON string."""
    return (TOKENIZERS / "xlmr-unigram" / "tokenizer.json").read_text()


def encoder_config(model_type: str, classifier: bool = False, **over: object) -> dict:
    roberta = model_type != "bert"
    name = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[model_type]
    config = {
        "model_type": model_type,
        "architectures": [f"{name}ForSequenceClassification" if classifier else f"{name}Model"],
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "hidden_act": "gelu",
        "max_position_embeddings": 514 if roberta else 512,
        "type_vocab_size": 1 if roberta else 2,
        "layer_norm_eps": 1e-5 if roberta else 1e-12,
        "pad_token_id": 1 if roberta else 0,
    }
    if classifier:
        config["id2label"] = {"0": "LABEL_0"}
    config.update(over)
    return config


# DistilBERT's config names for BERT's fields, and its weight names for BERT's (one layer's)
_DISTIL_FIELDS = {"hidden_size": "dim", "num_hidden_layers": "n_layers",
                  "num_attention_heads": "n_heads", "intermediate_size": "hidden_dim",
                  "hidden_act": "activation"}  # fmt: skip
DISTIL_NAMES = {
    "encoder.layer.": "transformer.layer.",
    ".attention.self.query.": ".attention.q_lin.",
    ".attention.self.key.": ".attention.k_lin.",
    ".attention.self.value.": ".attention.v_lin.",
    ".attention.output.dense.": ".attention.out_lin.",
    ".attention.output.LayerNorm.": ".sa_layer_norm.",
    ".intermediate.dense.": ".ffn.lin1.",
    ".output.dense.": ".ffn.lin2.",
    ".output.LayerNorm.": ".output_layer_norm.",
}


def distilbert_checkpoint(path: Path) -> tuple[Path, dict[str, np.ndarray], dict]:
    """A DistilBertModel checkpoint (its config and weight names, no token types, under
    ``distilbert.``), with BERT's weights and config for the oracle."""
    path.mkdir(parents=True, exist_ok=True)
    bert = encoder_config("bert", type_vocab_size=1)
    weights = {k: v for k, v in random_weights(bert, prefixed=False).items()
               if not k.startswith(("pooler", "embeddings.token_type"))}  # fmt: skip
    weights["embeddings.token_type_embeddings.weight"] = np.zeros((1, 64), np.float32)
    distil = _renamed(
        {k: v for k, v in weights.items() if not k.startswith("embeddings.token_type")},
        DISTIL_NAMES,
        "distilbert.",
    )
    config = {_DISTIL_FIELDS.get(k, k): v for k, v in bert.items() if k != "type_vocab_size"}
    config |= {"model_type": "distilbert", "architectures": ["DistilBertModel"]}
    save_file(distil, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(wordpiece_tokenizer())
    return path, weights, bert


# MPNet's weight names for BERT's (one layer's attention)
MPNET_NAMES = {
    ".attention.self.query.": ".attention.attn.q.",
    ".attention.self.key.": ".attention.attn.k.",
    ".attention.self.value.": ".attention.attn.v.",
    ".attention.output.dense.": ".attention.attn.o.",
    ".attention.output.LayerNorm.": ".attention.LayerNorm.",
}


def _renamed(weights: dict[str, np.ndarray], names: dict[str, str], prefix: str) -> dict:
    out = {}
    for name, value in weights.items():
        for old, new in names.items():
            name = name.replace(old, new)
        out[prefix + name] = value
    return out


def mpnet_checkpoint(path: Path) -> tuple[Path, dict[str, np.ndarray], dict]:
    """An MPNetForMaskedLM checkpoint (its names under ``mpnet.``, the shared
    ``encoder.relative_attention_bias`` [32, heads], no token types, RoBERTa's positions from
    padding_idx + 1, an MLM head to drop), with BERT-named weights and a config for the oracle
    (the bias kept under its MPNet name, a zero token-type row). Its tokenizer: the XLM-R
    Unigram's, whose ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2 and ``<s> A </s></s> B </s>`` template
    are MPNet's own."""
    path.mkdir(parents=True, exist_ok=True)
    bert = encoder_config("roberta") | {"model_type": "mpnet"}
    weights = {k: v for k, v in random_weights(bert, prefixed=False).items()
               if not k.startswith(("pooler", "embeddings.token_type"))}  # fmt: skip
    weights["encoder.relative_attention_bias.weight"] = (
        np.random.default_rng(4).standard_normal((32, 4)).astype(np.float32)
    )
    mpnet = _renamed(weights, MPNET_NAMES, "mpnet.")
    mpnet["lm_head.dense.weight"] = np.zeros((64, 64), np.float32)
    weights["embeddings.token_type_embeddings.weight"] = np.zeros((1, 64), np.float32)
    config = {k: v for k, v in bert.items() if k != "type_vocab_size"}
    config |= {"architectures": ["MPNetForMaskedLM"], "relative_attention_num_buckets": 32}
    save_file(mpnet, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(unigram_tokenizer())
    return path, weights, config | {"type_vocab_size": 1}


def electra_checkpoint(path: Path) -> tuple[Path, dict[str, np.ndarray], dict]:
    """An ElectraForPreTraining (discriminator) checkpoint: BERT's names under ``electra.`` with
    32-wide embeddings and ``embeddings_project`` up to the hidden 64, and the discriminator
    head to drop; the oracle reads the same weights unprefixed."""
    path.mkdir(parents=True, exist_ok=True)
    config = encoder_config("bert") | {"model_type": "electra", "embedding_size": 32,
                                       "architectures": ["ElectraForPreTraining"]}  # fmt: skip
    weights = {k: v for k, v in random_weights(config, prefixed=False).items()
               if not k.startswith(("pooler", "embeddings."))}  # fmt: skip
    rng = np.random.default_rng(5)
    for name, rows in (("word", VOCAB), ("position", 512), ("token_type", 2)):
        weights[f"embeddings.{name}_embeddings.weight"] = rng.standard_normal((rows, 32)).astype(
            np.float32
        )
    weights["embeddings.LayerNorm.weight"] = (1 + rng.standard_normal(32) * 0.1).astype(np.float32)
    weights["embeddings.LayerNorm.bias"] = (rng.standard_normal(32) * 0.1).astype(np.float32)
    weights["embeddings_project.weight"] = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
    weights["embeddings_project.bias"] = (rng.standard_normal(64) * 0.1).astype(np.float32)
    electra = {f"electra.{k}": v for k, v in weights.items()}
    electra["discriminator_predictions.dense.weight"] = np.zeros((64, 64), np.float32)
    save_file(electra, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(wordpiece_tokenizer())
    return path, weights, config


def random_weights(
    config: dict,
    prefixed: bool = False,
    seed: int = 0,
    std: float = 0.1,
    embedding_std: tuple[float, float] = (1.0, 0.5),
) -> dict[str, np.ndarray]:
    """Float32 weights under ``BertModel`` / ``XLMRobertaModel``'s names (with the base model's
    prefix when ``prefixed``, and the classification head a ``*ForSequenceClassification``
    config names), normal with ``std``, the word and the position / token-type embeddings with
    ``embedding_std`` (the tests' defaults spread the vectors apart; the encoder benchmark draws
    everything at BERT's initializer range, 0.02, so activations stay in a trained model's
    range), LayerNorm scales near 1. The pooler is there unless the checkpoint is RoBERTa's
    classifier, which has none (``add_pooling_layer=False``)."""
    rng = np.random.default_rng(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    roberta = config["model_type"] != "bert"
    prefix = ("roberta." if roberta else "bert.") if prefixed else ""
    classifier = config["architectures"][0].endswith("ForSequenceClassification")

    def mat(*shape: int, scale: float = std) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + mat(h), f"{name}.bias": mat(h)}

    def linear(name: str, out: int, inp: int) -> dict[str, np.ndarray]:
        return {f"{name}.weight": mat(out, inp), f"{name}.bias": mat(out)}

    words, positions = embedding_std
    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": mat(config["vocab_size"], h, scale=words),
        "embeddings.position_embeddings.weight": mat(
            config["max_position_embeddings"], h, scale=positions
        ),
        "embeddings.token_type_embeddings.weight": mat(
            config["type_vocab_size"], h, scale=positions
        ),
        "embeddings.position_ids": np.arange(config["max_position_embeddings"])[None],
        **norm("embeddings.LayerNorm"),
    }
    for n in range(config["num_hidden_layers"]):
        layer = f"encoder.layer.{n}"
        for part in ("query", "key", "value"):
            w |= linear(f"{layer}.attention.self.{part}", h, h)
        w |= linear(f"{layer}.attention.output.dense", h, h)
        w |= norm(f"{layer}.attention.output.LayerNorm")
        w |= linear(f"{layer}.intermediate.dense", inter, h)
        w |= linear(f"{layer}.output.dense", h, inter)
        w |= norm(f"{layer}.output.LayerNorm")
    if not (roberta and classifier):
        w |= linear("pooler.dense", h, h)
    w = {prefix + k: v for k, v in w.items()}
    if classifier:
        if roberta:
            w |= linear("classifier.dense", h, h) | linear("classifier.out_proj", 1, h)
        else:
            w |= linear("classifier", 1, h)
    return w


def write_encoder(
    path: Path, model_type: str, classifier: bool = False, prefixed: bool = True, **over: object
) -> tuple[Path, dict[str, np.ndarray], dict]:
    """The checkpoint directory, its weights and its config."""
    path.mkdir(parents=True, exist_ok=True)
    config = encoder_config(model_type, classifier, **over)
    weights = random_weights(config, prefixed)
    save_file(weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    text = wordpiece_tokenizer() if model_type == "bert" else unigram_tokenizer()
    (path / "tokenizer.json").write_text(text)
    return path, weights, config


def long_tailed_texts(count: int, seed: int = 1) -> list[str]:
    """Texts of log-normal word counts (median ~12, a few in the hundreds), from docs/engine.md."""
    words = (DOCS / "engine.md").read_text().split()
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.5, 1.0, count).astype(int), 1, 400)
    return [" ".join(words[s : s + n]) for s, n in zip(rng.integers(0, 1000, count), lengths)]


def write_m3_heads(path: Path, hidden: int = 64) -> tuple[dict, dict]:
    """BGE-M3's sparse and ColBERT heads (random) beside a checkpoint, as torch writes them."""
    from tests.support.torch_files import write_torch_state_dict

    rng = np.random.default_rng(9)
    sparse = {"weight": rng.standard_normal((1, hidden)) * 0.3, "bias": np.array([0.1])}
    colbert = {
        "weight": rng.standard_normal((hidden, hidden)) * 0.1,
        "bias": rng.standard_normal(hidden) * 0.1,
    }
    write_torch_state_dict(path / "sparse_linear.pt", sparse)
    write_torch_state_dict(path / "colbert_linear.pt", colbert)
    return sparse, colbert
