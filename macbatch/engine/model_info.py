"""Facts about the loaded model, decided once at load: every layer reads them from here.

Before this object the context length was computed in four places with three fallbacks, and the
tool-call format in two; now the engine computes a ``ModelInfo`` when it is built and front ends
read ``EngineInfo`` (the same facts plus the KV pool's) from the engine or its thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from macbatch.engine.pooling.embedding_profile import EmbeddingProfile

if TYPE_CHECKING:
    from macbatch.engine.lora.bank import AdapterRef
    from macbatch.engine.parsers.reasoning import ReasoningFormat
    from macbatch.engine.parsers.tool_calls import ToolFormat


# The context length assumed for a model whose config does not declare one (it caps the KV
# pool that ``memory_fraction`` sizes, and the longest sequence).
FALLBACK_CONTEXT_LENGTH = 32768


def declared_context_length(config: Mapping[str, Any]) -> int | None:
    """The context length a model declares: ``max_position_embeddings`` of its config.json (or
    of a multimodal checkpoint's ``text_config``), or of a loaded model's ``args``."""
    text = config.get("text_config")
    for source in (config, text if isinstance(text, Mapping) else {}):
        value = source.get("max_position_embeddings")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def context_length(declared: int | None, max_model_len: int | None) -> int:
    """The model's context length, the one rule: ``EngineConfig.max_model_len`` when set, else
    what the model declares, else ``FALLBACK_CONTEXT_LENGTH``."""
    return max_model_len or declared or FALLBACK_CONTEXT_LENGTH


@dataclass(frozen=True)
class ModelInfo:
    """What the model is, decided once at load."""

    name: str  # as the user named it: "demo", a hub id, a path
    model_type: str  # config.json's model_type ("qwen3", "llama" ...)
    vocab_size: int
    max_model_len: int  # the model's context length (or EngineConfig.max_model_len)
    tool_format: ToolFormat | None  # the chat template's tool-call format, if macbatch parses it
    reasoning_format: ReasoningFormat | None  # how the template marks a reasoning block
    thinking_default: bool | None  # the template's thinking switch default (None: no switch)
    kv_bytes_per_token: int  # K and V of every layer, scales of quantized pages included
    # how it pools and scores (pooling requests: engine/pooling/methods.py)
    embedding: EmbeddingProfile = field(default_factory=EmbeddingProfile)
    # the fine-tunes a request may name (engine/lora/bank.py), by name
    adapters: Mapping[str, AdapterRef] = field(default_factory=dict)
    # what it does, when not a decoder's (generate, embed, score, and rerank for a reranker):
    # an encoder's, engine/encoder/facts.py
    tasks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class EngineInfo:
    """The model's facts and the KV pool's: plain data, safe to read from any thread."""

    model: ModelInfo
    block_size: int
    kv_blocks_cap: int  # the most blocks the pool may hold (an elastic pool starts smaller)
    context_limit: int  # the most tokens one sequence may hold: min(model, the pool's cap)
    context_limit_reason: str  # what sets it, in words ("the model's context length" ...)

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def model_type(self) -> str:
        return self.model.model_type

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len
