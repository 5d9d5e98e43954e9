"""Tiny random ``*ForSequenceClassification`` checkpoints of DistilBERT, MPNet, ELECTRA,
DeBERTa-v2, ModernBERT (CLS and mean pooling), gte and Nomic BERT written with numpy, no torch:
each family's base checkpoint from its existing writer (``encoder_checkpoints.py``,
``encoder_families.py``), its pre-training head dropped, the base model under the prefix its
published classifier has, the classification head's random weights beside it under the names
``encoder_head_oracle.HEADS`` gives, and the config naming the classifier. The float64 oracle:
the family's numpy encoder (``encoder_oracle.py`` / ``encoder_family_oracle.py``) then the head
oracle, on the tokenizer's own ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from tests.support.encoder_checkpoints import (
    distilbert_checkpoint,
    electra_checkpoint,
    mpnet_checkpoint,
)
from tests.support.encoder_families import (
    deberta_config,
    gte_config,
    modernbert_config,
    nomic_config,
    write_family,
)
from tests.support.encoder_family_oracle import family_hidden
from tests.support.encoder_head_oracle import HEADS, head_logits
from tests.support.encoder_oracle import oracle_hidden

Checkpoint = tuple[Path, dict[str, np.ndarray], dict]  # its directory, weights and config


@dataclass(frozen=True)
class HeadFamily:
    name: str
    architecture: str  # the published classifier's
    prefix: str  # where it keeps the base model's weights
    write: Callable[[Path], Checkpoint]  # the base checkpoint, and the encoder oracle's inputs
    hidden: Callable[[dict, dict, list[int], list[int]], np.ndarray]  # the encoder oracle
    types: bool = False  # its forward reads token types
    config: dict = field(default_factory=dict)  # what its config says of the head
    seed: int = 0


HEAD_FAMILIES = (
    HeadFamily("distilbert", "DistilBertForSequenceClassification", "distilbert.",
               distilbert_checkpoint, oracle_hidden),
    HeadFamily("mpnet", "MPNetForSequenceClassification", "mpnet.", mpnet_checkpoint,
               oracle_hidden, seed=1),
    HeadFamily("electra", "ElectraForSequenceClassification", "electra.", electra_checkpoint,
               oracle_hidden, types=True, seed=2),
    # another activation than the default, from the config
    HeadFamily("deberta-v2", "DebertaV2ForSequenceClassification", "deberta.",
               lambda p: write_family(p, deberta_config()), family_hidden,
               config={"pooler_hidden_act": "tanh"}, seed=3),
    HeadFamily("modernbert", "ModernBertForSequenceClassification", "model.",
               lambda p: write_family(p, modernbert_config()), family_hidden,
               config={"classifier_pooling": "cls"}, seed=4),
    # the other pooling, a dense bias and another activation, each from the config
    HeadFamily("modernbert-mean", "ModernBertForSequenceClassification", "model.",
               lambda p: write_family(p, modernbert_config(biases=True)), family_hidden,
               config={"classifier_pooling": "mean", "classifier_bias": True,
                       "classifier_activation": "silu"}, seed=5),
    # gte-multilingual-reranker-base's shape: XLM-R's Unigram, one token type, plain RoPE
    HeadFamily("gte", "NewForSequenceClassification", "new.",
               lambda p: write_family(p, gte_config(multilingual=True)), family_hidden, seed=6),
    HeadFamily("nomic_bert", "NomicBertForSequenceClassification", "bert.",
               lambda p: write_family(p, nomic_config()), family_hidden, types=True, seed=7),
)  # fmt: skip


@dataclass
class HeadCheckpoint:
    path: Path
    family: HeadFamily
    weights: dict[str, np.ndarray]  # the encoder oracle's
    config: dict  # the encoder oracle's
    published: dict  # the checkpoint's config.json
    head: dict[str, np.ndarray]  # the head's weights, as published

    def logits(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """The float64 oracle's logit of each (query, document), tokenized by its tokenizer."""
        tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        out = []
        for query, document in pairs:
            encoding = tokenizer.encode(query, document)
            types = encoding.type_ids if self.family.types else [0] * len(encoding.ids)
            hidden = self.family.hidden(self.weights, self.config, encoding.ids, types)
            out.append(head_logits(self.head, self.published, hidden)[0])
        return np.array(out)


def write_head_checkpoint(path: Path, family: HeadFamily) -> HeadCheckpoint:
    """``family``'s base checkpoint at ``path`` made a one-label classifier."""
    path, weights, config = family.write(path)
    saved = load_file(str(path / "model.safetensors"))
    if any(k.startswith(family.prefix) for k in saved):  # a pre-training checkpoint: its head off
        base = {k: v for k, v in saved.items() if k.startswith(family.prefix)}
    else:
        base = {family.prefix + k: v for k, v in saved.items()}
    published = json.loads((path / "config.json").read_text()) | family.config
    published |= {"architectures": [family.architecture], "id2label": {"0": "LABEL_0"}}
    head = head_weights(published, family.seed)
    save_file(base | head, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(published))
    return HeadCheckpoint(path, family, weights, config, published, head)


def head_weights(config: dict, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """Random float32 weights of the config's head, the biases its modules hold."""
    head = HEADS[config["model_type"]]
    hidden = next(config[k] for k in ("hidden_size", "dim", "n_embd") if k in config)
    rng = np.random.default_rng(seed)

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {f"{head.dense}.weight": mat(hidden, hidden), f"{head.out}.weight": mat(1, hidden)}
    w[f"{head.out}.bias"] = mat(1)
    if head.dense_bias(config):
        w[f"{head.dense}.bias"] = mat(hidden)
    if head.norm is not None:
        w[f"{head.norm}.weight"] = 1 + mat(hidden)
        if config["norm_bias"]:
            w[f"{head.norm}.bias"] = mat(hidden)
    return w
