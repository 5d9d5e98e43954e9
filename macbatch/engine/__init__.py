"""The engine: continuous batching over a paged KV cache. Knows nothing about user interfaces.

Front ends use only the names exported here (see docs/engine.md).
"""

from macbatch.engine.adapter import UnsupportedModelError
from macbatch.engine.chat_template import (
    THINKING_SWITCH,
    check_chat_template_kwargs,
    thinking_default,
)
from macbatch.engine.config import EngineConfig
from macbatch.engine.constraints import StructuredOutput
from macbatch.engine.embedding_profile import EmbeddingProfile
from macbatch.engine.engine import Engine
from macbatch.engine.engine_stats import EngineStats
from macbatch.engine.model_info import EngineInfo, ModelInfo
from macbatch.engine.pooling import POOLING_METHODS, PoolingParams
from macbatch.engine.prompt import Prompt, PromptInput
from macbatch.engine.request import (
    FinishReason,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SpeculationCounts,
)
from macbatch.engine.runtime import EngineDeadError, EngineThread
from macbatch.engine.sampling import InvalidSamplingParam, SamplingParams
from macbatch.engine.tokenizer import Tokenizer

__all__ = [
    "EmbeddingProfile",
    "POOLING_METHODS",
    "PoolingParams",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineInfo",
    "EngineStats",
    "EngineThread",
    "FinishReason",
    "InvalidSamplingParam",
    "ModelInfo",
    "Prompt",
    "PromptInput",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SpeculationCounts",
    "StructuredOutput",
    "Tokenizer",
    "UnsupportedModelError",
    "THINKING_SWITCH",
    "check_chat_template_kwargs",
    "thinking_default",
]
