"""Facts about the loaded model, decided once at load: every layer reads them from here.

Before this object the context length was computed in four places with three fallbacks, and the
tool-call format in two; now the engine computes a ``ModelInfo`` when it is built and front ends
read ``EngineInfo`` (the same facts plus the KV pool's) from the engine or its thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from macbatch.engine.reasoning import ReasoningFormat
    from macbatch.engine.tool_calls import ToolFormat


class Tokenizer(Protocol):
    """What macbatch needs of a tokenizer (mlx-lm's ``TokenizerWrapper`` is one): text to ids
    and back. Chat templating goes through ``chat_template.py``, which reads the rest."""

    def encode(self, text: str, *args: object, **kwargs: object) -> list[int]: ...

    def decode(self, token_ids: list[int], *args: object, **kwargs: object) -> str: ...


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


@dataclass(frozen=True)
class EngineInfo:
    """The model's facts and the KV pool's: plain data, safe to read from any thread."""

    model: ModelInfo
    block_size: int
    kv_blocks_total: int
    context_limit: int  # the most tokens one sequence may hold: min(model, whole pool)
    context_limit_reason: str  # what sets it, in words ("the model's context length" ...)

    @property
    def model_name(self) -> str:
        return self.model.name
