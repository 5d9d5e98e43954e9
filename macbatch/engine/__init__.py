"""The engine: continuous batching over a paged KV cache. Knows nothing about user interfaces.

Front ends use only the names exported here (see docs/engine.md).
"""

from macbatch.engine.config import EngineConfig
from macbatch.engine.core.outputs import (
    FinishReason,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SpeculationCounts,
)
from macbatch.engine.core.stats import EngineStats
from macbatch.engine.engine import Engine
from macbatch.engine.inputs.chat_template import (
    THINKING_SWITCH,
    check_chat_template_kwargs,
    thinking_default,
)
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.inputs.tokenizer import Tokenizer
from macbatch.engine.model.adapter import UnsupportedModelError
from macbatch.engine.model_info import EngineInfo, ModelInfo
from macbatch.engine.pooling.embedding_profile import EmbeddingProfile
from macbatch.engine.pooling.methods import POOLING_METHODS, PoolingParams
from macbatch.engine.runtime import EngineDeadError, EngineThread
from macbatch.engine.sample.params import InvalidSamplingParam, SamplingParams
from macbatch.engine.structured_output.constraints import StructuredOutput

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
