"""Every encoder family's ``*ForSequenceClassification`` head in float64 numpy (BERT's, RoBERTa's,
XLM-R's, DistilBERT's, MPNet's, ELECTRA's, DeBERTa-v2's, ModernBERT's, gte's and Nomic BERT's),
one row each as transformers' modeling files define it (read in
``transformers/models/*/modeling_*.py``): the logit ``out(norm(act(dense(pooled))))`` of one
sequence's last hidden states, its weights under the published checkpoints' names. The oracle
for macbatch's ``Classifier``; written apart from its ``ClassifierHead`` rows so a wrong row
there shows here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tests.support.encoder_family_oracle import _dense, _gelu, _norm, _silu

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "gelu": _gelu,  # ACT2FN's "gelu": the exact, erf one
    "silu": _silu,
}


@dataclass(frozen=True)
class HeadOracle:
    """One family's head: where its weights are and what its config may change of it."""

    dense: str
    out: str
    activation: str  # the family's own, or ``activation_field``'s default
    activation_field: str | None = None  # the config field naming it
    norm: str | None = None  # ModernBertPredictionHead's LayerNorm (norm_eps, norm_bias)
    bias_field: str | None = None  # the config field saying whether dense has a bias
    pooling_field: str | None = None  # the config field naming the pooled row (default cls)

    def dense_bias(self, config: dict) -> bool:
        return bool(config.get(self.bias_field, False)) if self.bias_field else True

    def act(self, config: dict) -> str:
        named = config.get(self.activation_field) if self.activation_field else None
        return str(named or self.activation)

    def pooling(self, config: dict) -> str:
        named = config.get(self.pooling_field) if self.pooling_field else None
        return str(named or "cls")


_ROBERTA = HeadOracle("classifier.dense", "classifier.out_proj", "tanh")
HEADS = {
    # BertForSequenceClassification: BertPooler's tanh(dense([CLS])), then classifier
    "bert": HeadOracle("bert.pooler.dense", "classifier", "tanh"),
    # RobertaClassificationHead (XLM-R's the same): dense, tanh, out_proj on <s>
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    # DistilBertForSequenceClassification: pre_classifier, ReLU, classifier on [CLS]
    "distilbert": HeadOracle("pre_classifier", "classifier", "relu"),
    # MPNetClassificationHead: RoBERTa's
    "mpnet": _ROBERTA,
    # ElectraClassificationHead: the same with get_activation("gelu")
    "electra": HeadOracle("classifier.dense", "classifier.out_proj", "gelu"),
    # ContextPooler: dense, ACT2FN[pooler_hidden_act] (DebertaV2Config's default gelu)
    "deberta-v2": HeadOracle("pooler.dense", "classifier", "gelu", "pooler_hidden_act"),
    # ModernBertPredictionHead over classifier_pooling's row (cls or the mask's mean)
    "modernbert": HeadOracle(
        "head.dense", "classifier", "gelu", activation_field="classifier_activation",
        norm="head.norm", bias_field="classifier_bias", pooling_field="classifier_pooling",
    ),
    # GtePooler / NomicBertPooler (inside the base model: tanh(dense([CLS]))), then classifier
    "new": HeadOracle("new.pooler.dense", "classifier", "tanh"),
    "nomic_bert": HeadOracle("bert.pooler.dense", "classifier", "tanh"),
}  # fmt: skip


def head_logits(weights: dict, config: dict, hidden: np.ndarray) -> np.ndarray:
    """The head's float64 logits [num_labels] of one sequence's hidden states [L, hidden];
    ``weights`` and ``config`` as the checkpoint publishes them."""
    head = HEADS[config["model_type"]]
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    pooled = hidden.mean(0) if head.pooling(config) == "mean" else hidden[0]
    x = ACTIVATIONS[head.act(config)](_dense(pooled, w, head.dense))
    if head.norm is not None:
        x = _norm(x, w, head.norm, config["norm_eps"])
    return _dense(x, w, head.out)
