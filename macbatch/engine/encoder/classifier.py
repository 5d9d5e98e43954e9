"""The classification head of every ``*ForSequenceClassification`` encoder family, one module
for all of them: ``out(norm(act(dense(pooled))))`` over each pair's pooled row, its weight
names, activation, norm and pooling the family's ``ClassifierHead`` (engine/model/families.py;
the config's overrides read in ``config.py``). It sits beside the family's encoder module, so
the encoders themselves know nothing of heads."""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.encoder.bert import activation
from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.weights import renamed


class Classifier(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        assert c.head is not None
        h = c.hidden_size
        self.dense = nn.Linear(h, h, bias=c.head.dense_bias)
        self.act = activation(c.head.activation)
        if c.head.norm is not None:
            self.norm = nn.LayerNorm(h, eps=c.layer_norm_eps, bias=c.norm_bias)
        self.out = nn.Linear(h, c.num_labels)

    def __call__(self, pooled: mx.array) -> mx.array:
        """Logits [S, num_labels] of the pooled rows [S, hidden]."""
        x = self.act(self.dense(pooled))  # type: ignore[operator]
        return self.out(self.norm(x) if "norm" in self else x)


def with_classifier(model: nn.Module, config: EncoderConfig) -> nn.Module:
    """``model`` holding a ``classifier`` when the checkpoint has a head (its weights then load
    with the encoder's, under ``classifier_weights``' names)."""
    if config.head is not None:
        model.classifier = Classifier(config)
    return model


def classifier_weights(weights: dict[str, mx.array], config: EncoderConfig) -> dict[str, mx.array]:
    """The head's weights from the checkpoint's, under the ``Classifier``'s names (none when
    it has no head)."""
    head = config.head
    if head is None:
        return {}
    names = {"dense": head.dense, "out": head.out} | ({"norm": head.norm} if head.norm else {})
    table = tuple((rf"^{re.escape(hf)}\.", f"classifier.{ours}.") for ours, hf in names.items())
    return renamed(weights, config.layout.prefix, table)
