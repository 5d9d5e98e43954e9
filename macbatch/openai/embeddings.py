"""OpenAI's embeddings body -> pooling requests, and pooled vectors -> its response.

``parse_embeddings`` reads ``POST /v1/embeddings`` (and ``run``'s rows with that URL): ``input``
as a string, a list of strings, a list of token ids or a list of such lists; ``encoding_format``
float or base64; ``dimensions`` (Matryoshka truncation). macbatch's extras: ``truncate`` (embed
the first tokens of an input longer than the context instead of refusing it), ``normalize``,
``pooling`` (last, mean, cls) and ``prompt_name`` (one of the model's sentence-transformers
prompts, e.g. Qwen3-Embedding's "query", prepended to every text input); and, for an encoder
that ships BGE-M3's heads, FlagEmbedding's ``return_sparse`` and ``return_colbert_vecs``: each
embedding object then carries ``lexical_weights`` (token id -> weight) and ``colbert_vecs``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from macbatch.engine import (
    POOLING_METHODS,
    EmbeddingProfile,
    PoolingParams,
    Prompt,
    PromptInput,
    RequestOutput,
)
from macbatch.openai.bodies import check_value
from macbatch.openai.errors import InvalidRequest

MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class Embedding:
    """One embeddings body's work, read from the body alone."""

    inputs: tuple[Prompt, ...]  # each a non-empty string or non-empty list of token ids
    params: PoolingParams
    encoding_format: str
    prompt_name: str | None
    model: str | None

    def bind(self, profile: EmbeddingProfile) -> tuple[tuple[PromptInput, PoolingParams], ...]:
        """One pooling request per input; ``prompt_name`` names one of the model's prompts and
        ``dimensions`` keeps at most the model's hidden size."""
        hidden, dimensions = profile.hidden_size, self.params.dimensions
        if dimensions is not None and hidden and dimensions > hidden:
            raise InvalidRequest(
                f"'dimensions' ({dimensions}) is more than the model's {hidden}", "dimensions"
            )
        prefix = ""
        name = self.prompt_name or profile.default_prompt
        if name is not None:
            if name not in profile.prompts:
                known = ", ".join(profile.prompts) or "none"
                raise InvalidRequest(
                    f"'prompt_name' {name!r} is not one of the model's prompts ({known})",
                    "prompt_name",
                )
            prefix = profile.prompts[name]
        return tuple(
            (PromptInput(prefix + p if isinstance(p, str) else p), self.params) for p in self.inputs
        )


def parse_embeddings(body: Any) -> Embedding:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_value(body)
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise InvalidRequest(
            f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", "encoding_format"
        )
    method = _optional(body, "pooling", str)
    if method is not None and method not in POOLING_METHODS:
        names = ", ".join(POOLING_METHODS)
        raise InvalidRequest(f"'pooling' must be one of {names}, got {method!r}", "pooling")
    dimensions = _optional(body, "dimensions", int)
    if dimensions is not None and dimensions < 1:
        raise InvalidRequest(f"'dimensions' must be at least 1, got {dimensions}", "dimensions")
    params = PoolingParams(
        method=method,
        normalize=_optional(body, "normalize", bool),
        dimensions=dimensions,
        truncate=bool(_optional(body, "truncate", bool)),
        lexical=bool(_optional(body, "return_sparse", bool)),
        colbert=bool(_optional(body, "return_colbert_vecs", bool)),
    )
    return Embedding(
        inputs=parse_inputs(body.get("input"), "input"),
        params=params,
        encoding_format=encoding,
        prompt_name=_optional(body, "prompt_name", str),
        model=_optional(body, "model", str),
    )


def parse_inputs(value: Any, name: str) -> tuple[Prompt, ...]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if isinstance(value, str) or _token_ids(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise InvalidRequest(
            f"'{name}' must be a string, a list of strings, a list of token ids or a list of "
            "token-id lists, and not empty",
            name,
        )
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'{name}' holds {len(items)} inputs; at most {MAX_INPUTS}", name)
    for i, item in enumerate(items):
        where = f"{name}[{i}]" if items is value else name
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"'{where}' is an empty string", where)
        elif not _token_ids(item):
            raise InvalidRequest(
                f"'{where}' must be a non-empty string or a non-empty list of token ids", where
            )
    return tuple(items)


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidRequest(f"'{name}' must be {kind.__name__}, got {value!r}", name)
    return value


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or the base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def embeddings_response(
    outputs: Sequence[RequestOutput], model: str, encoding_format: str
) -> dict[str, Any]:
    """OpenAI's ``list`` of ``embedding`` objects (``outputs`` in input order) with usage."""
    tokens = sum(o.metrics.prompt_tokens for o in outputs)
    return {
        "object": "list",
        "data": [_embedding_object(i, o, encoding_format) for i, o in enumerate(outputs)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _embedding_object(index: int, output: RequestOutput, encoding_format: str) -> dict[str, Any]:
    item: dict[str, Any] = {
        "object": "embedding",
        "index": index,
        "embedding": encode_vector(output.embedding, encoding_format),
    }
    if output.lexical_weights is not None:  # FlagEmbedding's shape: token id (a string) -> weight
        item["lexical_weights"] = {str(t): w for t, w in output.lexical_weights.items()}
    if output.colbert_vectors is not None:
        item["colbert_vecs"] = [encode_vector(v, encoding_format) for v in output.colbert_vectors]
    return item
