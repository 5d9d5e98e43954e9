"""Prompts to an encoder engine's requests, the paged engine's ``InputProcessor`` counterpart:
text as it is (a front end has prepended the checkpoint's named prompt already), token ids, or a
``TextPair`` for a cross-encoder; each request carries its token types. It reads only what the
load fixed and the tokenizer, so any thread may call it."""

from __future__ import annotations

from typing import Any

from macbatch.engine.core.request import Request
from macbatch.engine.encoder.model import EncoderInput, EncoderModel
from macbatch.engine.inputs.processor import M3_ONLY, fit_pooled, pooling_request
from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.model_info import EngineInfo
from macbatch.engine.multimodal.vision import VisionSupport
from macbatch.engine.pooling.embedding_profile import TextPair
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams

TEXT_ONLY = "an encoder model reads text only"


class EncoderTokenizer:
    """The checkpoint's tokenizer as macbatch's ``Tokenizer`` protocol (with its special
    tokens, cut to the encoder's longest input, as the encoder reads text)."""

    def __init__(self, model: EncoderModel) -> None:
        self._model = model

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        return list(self._model.tokenize_text(text).ids)

    def decode(self, token_ids: list[int], *args: Any, **kwargs: Any) -> str:
        return str(self._model.tokenizer.decode(token_ids))


class EncoderProcessor:
    def __init__(self, model: EncoderModel, info: EngineInfo) -> None:
        self.model, self.info = model, info
        self.vision = VisionSupport(refusal=TEXT_ONLY)  # what the engine thread reports

    def encode(self, prompt: PromptInput) -> list[int]:
        return list(self._input(prompt, truncate=True).ids)

    def process(
        self,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None = None,
    ) -> Request:
        """A pooling request (``ValueError`` saying what is wrong; no MLX work happens)."""
        name = self.info.model_name
        if not isinstance(params, PoolingParams):
            raise ValueError(f"model '{name}' is an encoder: it embeds and scores, not generates")
        self._check(prompt, params)
        encoded = self._input(prompt, params.truncate)
        return pooling_request(
            list(encoded.ids),
            params,
            self.model.profile,
            request_id,
            token_types=list(encoded.types),
        )

    def _check(self, prompt: PromptInput, params: PoolingParams) -> None:
        name = self.info.model_name
        pair = isinstance(prompt.prompt, TextPair)
        if self.model.config.classifier and not pair:
            raise ValueError(
                f"model '{name}' is a cross-encoder: it scores (query, document) pairs "
                "(/v1/rerank, /v1/score, task: rerank) and does not embed"
            )
        if pair and not self.model.config.classifier:
            raise ValueError(f"model '{name}' embeds texts; it has no head that scores pairs")
        if (params.lexical or params.colbert) and self.model.m3 is None:
            raise ValueError(M3_ONLY)
        if prompt.adapter is not None:
            raise ValueError(f"model '{name}' is an encoder: it has no adapters")

    def _input(self, prompt: PromptInput, truncate: bool) -> EncoderInput:
        """Text and pairs are cut to the longest input, as sentence-transformers does; token
        ids longer are refused unless ``truncate``."""
        text = prompt.prompt
        if isinstance(text, TextPair):
            return self.model.tokenize_pair(text.first, text.second)
        if isinstance(text, str):
            if not text:
                raise ValueError("prompt is empty")
            return self.model.tokenize_text(text)
        ids = [t for t in text if isinstance(t, int) and not isinstance(t, bool)]
        if not ids or len(ids) != len(text):
            raise ValueError("an encoder's prompt is text, a list of token ids, or a text pair")
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in ids):
            raise ValueError(f"token ids must lie in 0..{vocab - 1}")
        info = self.info
        ids = fit_pooled(ids, truncate, info.context_limit, info.context_limit_reason)
        return EncoderInput(tuple(ids), (0,) * len(ids))
