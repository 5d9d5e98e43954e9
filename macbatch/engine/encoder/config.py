"""An encoder checkpoint's architecture, read once from its config.json (Hugging Face's field
names), with the facts each family decides differently: where positions start and which head
scores a pair."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from macbatch.engine.model.families import EncoderLayout, EncoderNaming, family


@dataclass(frozen=True)
class EncoderConfig:
    model_type: str
    layout: EncoderLayout
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    # ``*ForSequenceClassification``: the checkpoint scores a (query, document) pair
    classifier: bool
    num_labels: int

    @property
    def position_offset(self) -> int:
        """The position id of a sequence's first token."""
        return self.pad_token_id + 1 if self.layout.offset_positions else 0

    @property
    def max_tokens(self) -> int:
        """The longest sequence its position table holds."""
        return self.max_positions - self.position_offset

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> EncoderConfig:
        model_type = str(config["model_type"])
        layout = family(model_type).encoder
        if layout is None:
            raise ValueError(f"model type '{model_type}' is not an encoder macbatch runs")
        architectures = config.get("architectures") or []
        classifier = any(str(a).endswith("ForSequenceClassification") for a in architectures)
        labels = config.get("id2label")
        if classifier and layout.naming is not EncoderNaming.BERT:
            raise ValueError(f"a {model_type} sequence classifier's head is not built")

        def field(*names: str, default: Any = None) -> Any:
            """The first of ``names`` the config has (DistilBERT's own names come second)."""
            return next((config[n] for n in names if n in config), default)

        return cls(
            model_type=model_type,
            layout=layout,
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(field("hidden_size", "dim")),
            num_layers=int(field("num_hidden_layers", "n_layers")),
            num_heads=int(field("num_attention_heads", "n_heads")),
            intermediate_size=int(field("intermediate_size", "hidden_dim")),
            hidden_act=str(field("hidden_act", "activation", default="gelu")),
            max_positions=int(config.get("max_position_embeddings", 512)),
            # DistilBERT has no token types
            type_vocab_size=int(
                config.get("type_vocab_size", 2 if layout.naming is EncoderNaming.BERT else 0)
            ),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(config.get("pad_token_id") or 0),
            classifier=classifier,
            num_labels=int(config.get("num_labels") or (len(labels) if labels else 1)),
        )
