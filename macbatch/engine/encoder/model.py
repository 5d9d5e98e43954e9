"""A loaded encoder checkpoint: its model, tokenizer and sentence-transformers profile, and the
two things it does: embed texts (pooled as the checkpoint says) and score (query, document)
pairs with a cross-encoder's classification head. Inputs are packed into passes of at most
``max_batch_tokens`` rows with no padding (``packing.py``, ``varlen.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.facts import EncoderFacts, profile_for
from macbatch.engine.encoder.lexical import M3Heads
from macbatch.engine.encoder.packing import passes
from macbatch.engine.encoder.varlen import VarlenLayout, mean_rows
from macbatch.engine.pooling.embedding_profile import EmbeddingProfile

DEFAULT_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class EncoderInput:
    """One tokenized input: token ids and token type ids (1 for a pair's second text)."""

    ids: tuple[int, ...]
    types: tuple[int, ...]


class EncoderModel:
    """Not thread-safe: MLX work runs on the calling thread."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: object,
        profile: EmbeddingProfile,
        name: str,
        m3: M3Heads | None = None,
    ) -> None:
        """``m3``: BGE-M3's sparse and ColBERT heads, when the checkpoint ships them."""
        from tokenizers import Tokenizer

        assert isinstance(tokenizer, Tokenizer)
        self.model = model
        self.config: EncoderConfig = model.config
        self.tokenizer = tokenizer
        self.profile = profile
        self.name = name
        self.m3 = m3
        added = tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, token in added.items() if token.special)
        self.max_tokens = EncoderFacts(self.config, profile).max_tokens
        tokenizer.enable_truncation(self.max_tokens)
        tokenizer.no_padding()

    @classmethod
    def load(cls, name: str) -> EncoderModel:
        from tokenizers import Tokenizer

        from macbatch.engine.encoder.architectures import load_encoder
        from macbatch.engine.encoder.weights import read_weights

        directory = Path(name).expanduser()
        config = EncoderConfig.from_dict(json.loads((directory / "config.json").read_text()))
        model = load_encoder(read_weights(directory), config)
        profile = profile_for(directory, config)
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        m3 = M3Heads(directory) if M3Heads.present(directory) else None
        return cls(model, tokenizer, profile, name, m3)

    # -- inputs ------------------------------------------------------------------------------

    def tokenize(self, text: str, prompt_name: str | None = None) -> EncoderInput:
        """``text`` after the named prompt (the profile's default when none is named), with
        the checkpoint's special tokens, cut to ``max_tokens``."""
        prompt_name = prompt_name or self.profile.default_prompt
        if prompt_name is not None:
            if prompt_name not in self.profile.prompts:
                raise ValueError(f"unknown prompt_name '{prompt_name}'")
            text = self.profile.prompts[prompt_name] + text
        return self.tokenize_text(text)

    def tokenize_text(self, text: str) -> EncoderInput:
        """``text`` as it is (a caller that prepended its prompt already)."""
        encoding = self.tokenizer.encode(text)
        return EncoderInput(tuple(encoding.ids), tuple(encoding.type_ids))

    def tokenize_pair(self, query: str, document: str) -> EncoderInput:
        encoding = self.tokenizer.encode(query, document)
        return EncoderInput(tuple(encoding.ids), tuple(encoding.type_ids))

    # -- passes ------------------------------------------------------------------------------

    def hidden_states(self, inputs: Sequence[EncoderInput]) -> tuple[mx.array, VarlenLayout]:
        """One pass over ``inputs`` packed: the last layer's rows [T, hidden] and their layout."""
        lengths = [len(i.ids) for i in inputs]
        if min(lengths, default=0) < 1:
            raise ValueError("an encoder input needs at least one token")
        offset = self.config.position_offset
        ids = np.concatenate([i.ids for i in inputs]).astype(np.int32)
        types = np.concatenate([i.types for i in inputs]).astype(np.int32)
        if self.config.type_vocab_size <= 1:
            types[:] = 0
        positions = np.concatenate([np.arange(n) + offset for n in lengths]).astype(np.int32)
        layout = VarlenLayout.build(lengths)
        hidden = self.model(mx.array(ids), mx.array(positions), mx.array(types), layout)
        return hidden, layout

    def embed(
        self,
        inputs: Sequence[EncoderInput],
        pooling: str | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
    ) -> np.ndarray:
        """float32 [len(inputs), D] in input order: pooled (the profile's method unless named),
        cut to ``dimensions``, normalized when the profile (or ``normalize``) says so."""
        pooling = pooling or self.profile.pooling
        normalize = self.profile.normalize if normalize is None else normalize
        if dimensions is not None and not 0 < dimensions <= self.config.hidden_size:
            raise ValueError(f"dimensions must be 1..{self.config.hidden_size}")
        out = np.zeros((len(inputs), dimensions or self.config.hidden_size), np.float32)
        for members in passes([len(i.ids) for i in inputs], max_batch_tokens):
            hidden, layout = self.hidden_states([inputs[m] for m in members])
            vectors = pooled(hidden, layout, [len(inputs[m].ids) for m in members], pooling)
            out[members] = np.array(shaped(vectors, dimensions, normalize))
        return out

    def lexical_weights(
        self, inputs: Sequence[EncoderInput], max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    ) -> list[dict[int, float]]:
        """BGE-M3's sparse output per input: token id -> weight (``lexical.py``)."""
        heads = self._m3()
        return [
            heads.lexical_weights(rows, inputs[i].ids, self.special_ids)
            for i, rows in self._sequence_rows(inputs, max_batch_tokens)
        ]

    def colbert_vectors(
        self, inputs: Sequence[EncoderInput], max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    ) -> list[np.ndarray]:
        """BGE-M3's multi-vector output per input: float32 [tokens - 1, D] (``lexical.py``)."""
        heads = self._m3()
        return [
            heads.colbert_vectors(rows) for _, rows in self._sequence_rows(inputs, max_batch_tokens)
        ]

    def _m3(self) -> M3Heads:
        if self.m3 is None:
            raise ValueError(f"model '{self.name}' ships no sparse_linear.pt / colbert_linear.pt")
        return self.m3

    def _sequence_rows(
        self, inputs: Sequence[EncoderInput], max_batch_tokens: int
    ) -> list[tuple[int, mx.array]]:
        """Each input's last-layer rows, in input order."""
        out: list[tuple[int, mx.array]] = []
        for members in passes([len(i.ids) for i in inputs], max_batch_tokens):
            hidden, _ = self.hidden_states([inputs[m] for m in members])
            start = 0
            for m in members:
                out.append((m, hidden[start : start + len(inputs[m].ids)]))
                start += len(inputs[m].ids)
        return sorted(out, key=lambda pair: pair[0])

    def score(
        self, pairs: Sequence[EncoderInput], max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    ) -> np.ndarray:
        """A cross-encoder's relevance of each tokenized pair: the sigmoid of its one logit
        (sentence-transformers' ``CrossEncoder`` default for a one-label head), float32 [N]."""
        out = np.zeros(len(pairs), np.float32)
        for members in passes([len(p.ids) for p in pairs], max_batch_tokens):
            hidden, layout = self.hidden_states([pairs[m] for m in members])
            lengths = [len(pairs[m].ids) for m in members]
            out[members] = np.array(self.relevance(hidden, layout, lengths))
        return out

    def relevance(self, hidden: mx.array, layout: VarlenLayout, lengths: list[int]) -> mx.array:
        """Each packed pair's score [S] from its head over its pooled row (the CLS row, or the
        mean row where the head says so; ``score``, one pass)."""
        if self.config.head is None or self.config.num_labels != 1:
            raise ValueError(
                f"model '{self.name}' is not a one-label cross-encoder "
                "(a *ForSequenceClassification checkpoint with num_labels 1)"
            )
        rows = pooled(hidden, layout, lengths, self.config.head.pooling)
        logits = self.model.classifier(rows)[:, 0]
        return mx.sigmoid(logits.astype(mx.float32))


def pooled(
    hidden: mx.array, layout: VarlenLayout | None, lengths: list[int], method: str
) -> mx.array:
    """[S, hidden] float32: each sequence's first row, last row or mean row (``layout``: the
    pass's, which mean pooling needs)."""
    ends = np.cumsum(lengths)
    if method == "cls":
        return hidden[mx.array((ends - np.array(lengths)).astype(np.int32))].astype(mx.float32)
    if method == "last":
        return hidden[mx.array((ends - 1).astype(np.int32))].astype(mx.float32)
    if method == "mean" and layout is not None:
        return mean_rows(hidden, layout)
    raise ValueError(f"unknown pooling '{method}' (cls, mean, last)")


def shaped(vectors: mx.array, dimensions: int | None, normalize: bool) -> mx.array:
    """Pooled vectors [S, hidden] cut to their first ``dimensions`` (Matryoshka), then
    L2-normalized when asked."""
    vectors = vectors[:, :dimensions] if dimensions else vectors
    return vectors / mx.linalg.norm(vectors, axis=-1, keepdims=True) if normalize else vectors
