"""What an encoder checkpoint does, read from its files without its weights: for
``macbatch models`` and ``doctor`` (the loaded ``EncoderModel`` decides the same from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.model.config_file import read_model_config
from macbatch.engine.pooling.embedding_profile import (
    EmbeddingProfile,
    PairFormat,
    sentence_transformers_profile,
)

# an encoder checkpoint without a sentence-transformers config pools its CLS row, as BERT's
# pretraining and its classification heads read it
ENCODER_DEFAULT = "the default for encoder models (no sentence-transformers config): cls"


@dataclass(frozen=True)
class EncoderFacts:
    config: EncoderConfig
    profile: EmbeddingProfile

    @property
    def max_tokens(self) -> int:
        """The longest input it embeds: ``max_seq_length``, never past its position table."""
        limit = self.config.max_tokens
        return min(self.profile.max_seq_length or limit, limit)

    @property
    def tasks(self) -> list[str]:
        return ["score", "rerank"] if self.config.classifier else ["embed", "score"]

    def describe(self) -> str:
        if self.config.classifier:
            return f"cross-encoder ({self.config.num_labels} label), {self.max_tokens} tokens"
        normalized = ", normalized" if self.profile.normalize else ""
        return (
            f"{self.profile.pooling} pooling, {self.config.hidden_size} dimensions{normalized}, "
            f"{self.max_tokens} tokens"
        )


def profile_for(directory: Path, config: EncoderConfig) -> EmbeddingProfile:
    base = EmbeddingProfile(
        pooling="cls",
        hidden_size=config.hidden_size,
        source=ENCODER_DEFAULT,
        rerank=PairFormat() if config.classifier else None,
    )
    return sentence_transformers_profile(directory, base)


def encoder_facts(directory: Path) -> EncoderFacts | None:
    """The facts of the encoder checkpoint in ``directory`` (None: not an encoder it runs)."""
    try:
        config = EncoderConfig.from_dict(read_model_config(directory))
    except (OSError, ValueError, KeyError):
        return None
    return EncoderFacts(config, profile_for(directory, config))
