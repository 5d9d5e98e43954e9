"""Which module runs each encoder family's checkpoint, and how its Hugging Face weights map onto
that module's names (its classification head's: ``classifier.py``): the one place
``EncoderModel.load`` asks."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.encoder.bert import Encoder
from macbatch.engine.encoder.classifier import classifier_weights, with_classifier
from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.deberta import Deberta, deberta_weights
from macbatch.engine.encoder.modernbert import ModernBert, modernbert_weights
from macbatch.engine.encoder.rotary_bert import RotaryEncoder, rotary_weights
from macbatch.engine.encoder.weights import encoder_weights
from macbatch.engine.model.families import EncoderNaming

Weights = dict[str, mx.array]
_ARCHITECTURES: dict[EncoderNaming, tuple[Callable[[EncoderConfig], nn.Module],
                                          Callable[[Weights, EncoderConfig], Weights]]] = {
    EncoderNaming.BERT: (Encoder, encoder_weights),
    EncoderNaming.DISTILBERT: (Encoder, encoder_weights),
    EncoderNaming.MPNET: (Encoder, encoder_weights),
    EncoderNaming.ELECTRA: (Encoder, encoder_weights),
    EncoderNaming.GTE: (RotaryEncoder, rotary_weights),
    EncoderNaming.NOMIC: (RotaryEncoder, rotary_weights),
    EncoderNaming.MODERNBERT: (ModernBert, modernbert_weights),
    EncoderNaming.DEBERTA: (Deberta, deberta_weights),
}  # fmt: skip


def load_encoder(weights: Weights, config: EncoderConfig) -> nn.Module:
    """The family's module (with its classification head, when the checkpoint has one) holding
    ``weights`` (HF-named), evaluated; a checkpoint missing one of its weights, or holding one
    of the wrong shape, is refused by name."""
    build, rename = _ARCHITECTURES[config.layout.naming]
    model = with_classifier(build(config), config)
    ours = rename(weights, config) | classifier_weights(weights, config)
    model.load_weights(list(ours.items()))
    mx.eval(model.parameters())
    return model
