"""The engine: continuous batching over a paged KV cache. Knows nothing about user interfaces.

Front ends use only the names exported here (docs/engine.md), never a module inside the engine
(tests/test_import_graph.py fails on one). Each name is imported from its module when first
asked for (PEP 562), so that ``import macbatch.engine``, and the names whose modules need no
MLX (``Tokenizer``, ``PromptInput``, ``check_speculative`` ...), load no MLX: ``macbatch
--help`` checks and quotes the engine's speculative methods and stays instant.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports at the end are the exports' types, not used here)

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Every exported name -> the module that defines it: the one list (``__all__`` and ``__dir__``
# are read from it; the ``TYPE_CHECKING`` imports below repeat it for the type checker, and a
# test holds the two equal).
_EXPORTS: dict[str, str] = {
    # the engine and its thread
    "Engine": "macbatch.engine.engine",
    "EngineThread": "macbatch.engine.runtime",
    "EngineDeadError": "macbatch.engine.runtime",
    "OutputStream": "macbatch.engine.runtime",  # prepared requests' outputs (stream_prepared)
    "post_to_loop": "macbatch.engine.loop_handoff",  # outputs to an event loop, batched
    "Turns": "macbatch.engine.device",  # the device's turns, shared by engines on it
    "EngineConfig": "macbatch.engine.config",
    "check_indexer_keys": "macbatch.engine.stores.fp8_keys",  # the CLI's --indexer-keys check
    "read_adapter": "macbatch.engine.lora.files",  # a fine-tune's files (doctor)
    "AdapterError": "macbatch.engine.lora.files",
    "base_model_of": "macbatch.engine.lora.files",  # which model an adapter folder adapts
    "EngineStats": "macbatch.engine.core.stats",
    "EngineInfo": "macbatch.engine.model_info",
    "ModelInfo": "macbatch.engine.model_info",
    "declared_context_length": "macbatch.engine.model_info",
    # whole-model replicas under mlx.launch (docs/distributed.md)
    "ReplicatedEngine": "macbatch.engine.distributed.replicas",
    "load_replicas": "macbatch.engine.distributed.replicas",
    "replicas_problem": "macbatch.engine.distributed.replicas",
    "serve_replica": "macbatch.engine.distributed.replicas",
    # requests and what they report
    "Prompt": "macbatch.engine.inputs.prompt",
    "PromptInput": "macbatch.engine.inputs.prompt",
    "Tokenizer": "macbatch.engine.tokenizer",
    "THINKING_SWITCH": "macbatch.engine.inputs.chat_template",
    "check_chat_template_kwargs": "macbatch.engine.inputs.chat_template",
    "has_chat_template": "macbatch.engine.inputs.chat_template",
    "thinking_default": "macbatch.engine.inputs.chat_template",
    "SamplingParams": "macbatch.engine.sample.params",
    "InvalidSamplingParam": "macbatch.engine.sample.params",
    "MAX_LOGPROBS": "macbatch.engine.sample.params",
    "StructuredOutput": "macbatch.engine.structured_output.constraints",
    "PoolingParams": "macbatch.engine.pooling.methods",
    "POOLING_METHODS": "macbatch.engine.pooling.methods",
    "EmbeddingProfile": "macbatch.engine.pooling.embedding_profile",
    "EncoderModel": "macbatch.engine.encoder.model",  # BERT / XLM-R embedders, cross-encoders
    "encoder_facts": "macbatch.engine.encoder.facts",
    "EncoderEngine": "macbatch.engine.encoder.engine",  # one packed pass a step, no KV
    "load_engine": "macbatch.engine.engines",  # the engine a model name gets (encoder or paged)
    "TextPair": "macbatch.engine.pooling.embedding_profile",  # a cross-encoder's input
    "FinishReason": "macbatch.engine.core.outputs",
    "PromptTooLongError": "macbatch.engine.core.outputs",
    "RequestMetrics": "macbatch.engine.core.outputs",
    "RequestOutput": "macbatch.engine.core.outputs",
    "Request": "macbatch.engine.core.request",  # a prepared request (``Engine.prepare_request``)
    "SpeculationCounts": "macbatch.engine.core.outputs",
    "ACCEPTANCE_BUCKETS": "macbatch.engine.core.outputs",
    "ACCEPTED_LENGTH_BUCKETS": "macbatch.engine.core.outputs",
    "per_request_speculation": "macbatch.engine.core.outputs",
    # tool calls
    "ToolCall": "macbatch.engine.parsers.tool_calls",
    "ToolFormat": "macbatch.engine.parsers.tool_calls",
    "check_tools": "macbatch.engine.parsers.tool_calls",
    "chosen_tools": "macbatch.engine.parsers.tool_calls",
    "detect_tool_format": "macbatch.engine.parsers.tool_formats.detect",
    # images
    "Image": "macbatch.engine.multimodal.images",
    "ImageError": "macbatch.engine.multimodal.images",
    "load_image": "macbatch.engine.multimodal.images",
    # speculative decoding's methods, checked before a model loads
    "DEFAULT_SPECULATIVE_TOKENS": "macbatch.engine.speculative.methods",
    "DRAFT_MODEL_METHODS": "macbatch.engine.speculative.methods",
    "SPECULATIVE_MODES": "macbatch.engine.speculative.methods",
    "check_speculative": "macbatch.engine.speculative.methods",
    "describe_mtp_heads": "macbatch.engine.speculative.mtp_weights",
    "describe_dflash": "macbatch.engine.speculative.dflash_model",
    "is_dflash_config": "macbatch.engine.speculative.dflash_model",
    "describe_eagle3": "macbatch.engine.speculative.eagle3_model",
    "is_eagle3_config": "macbatch.engine.speculative.eagle3_model",
    # which models run, and what loading one would find (macbatch models, macbatch doctor)
    "UnsupportedModelError": "macbatch.engine.model.adapter",
    "unsupported_reason": "macbatch.engine.model.families",
    "unavailable_reason": "macbatch.engine.multimodal.vision",
    "resolve_model_path": "macbatch.engine.loader",
    "check_checkpoint": "macbatch.engine.loader",
    "load_tokenizer": "macbatch.engine.loader",  # a checkpoint's tokenizer, as the engine loads it
    "probe_model": "macbatch.engine.model.probe",
    # the disk KV cache's contents (macbatch cache)
    "StoredModel": "macbatch.engine.kv.disk.listing",
    "stored_models": "macbatch.engine.kv.disk.listing",
    "clear_stored": "macbatch.engine.kv.disk.listing",
    "not_caches": "macbatch.engine.kv.disk.listing",
    "default_cap_bytes": "macbatch.engine.kv.disk.cap",
    "cap_rule": "macbatch.engine.kv.disk.cap",
    # a model folder's config.json, read one way (a bad one is that model's problem)
    "BadConfig": "macbatch.engine.model.config_file",
    "read_model_config": "macbatch.engine.model.config_file",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # asked for once: later reads find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from macbatch.engine.config import EngineConfig
    from macbatch.engine.core.outputs import (
        ACCEPTANCE_BUCKETS,
        ACCEPTED_LENGTH_BUCKETS,
        FinishReason,
        PromptTooLongError,
        RequestMetrics,
        RequestOutput,
        SpeculationCounts,
        per_request_speculation,
    )
    from macbatch.engine.core.request import Request
    from macbatch.engine.core.stats import EngineStats
    from macbatch.engine.device import Turns
    from macbatch.engine.distributed.replicas import (
        ReplicatedEngine,
        load_replicas,
        replicas_problem,
        serve_replica,
    )
    from macbatch.engine.encoder.engine import EncoderEngine
    from macbatch.engine.encoder.facts import encoder_facts
    from macbatch.engine.encoder.model import EncoderModel
    from macbatch.engine.engine import Engine
    from macbatch.engine.engines import load_engine
    from macbatch.engine.inputs.chat_template import (
        THINKING_SWITCH,
        check_chat_template_kwargs,
        has_chat_template,
        thinking_default,
    )
    from macbatch.engine.inputs.prompt import Prompt, PromptInput
    from macbatch.engine.kv.disk.cap import (
        cap_rule,
        default_cap_bytes,
    )
    from macbatch.engine.kv.disk.listing import (
        StoredModel,
        clear_stored,
        not_caches,
        stored_models,
    )
    from macbatch.engine.loader import check_checkpoint, load_tokenizer, resolve_model_path
    from macbatch.engine.loop_handoff import post_to_loop
    from macbatch.engine.lora.files import AdapterError, base_model_of, read_adapter
    from macbatch.engine.model.adapter import UnsupportedModelError
    from macbatch.engine.model.config_file import BadConfig, read_model_config
    from macbatch.engine.model.families import unsupported_reason
    from macbatch.engine.model.probe import probe_model
    from macbatch.engine.model_info import EngineInfo, ModelInfo, declared_context_length
    from macbatch.engine.multimodal.images import Image, ImageError, load_image
    from macbatch.engine.multimodal.vision import unavailable_reason
    from macbatch.engine.parsers.tool_calls import ToolCall, ToolFormat, check_tools, chosen_tools
    from macbatch.engine.parsers.tool_formats.detect import detect_tool_format
    from macbatch.engine.pooling.embedding_profile import EmbeddingProfile, TextPair
    from macbatch.engine.pooling.methods import POOLING_METHODS, PoolingParams
    from macbatch.engine.runtime import EngineDeadError, EngineThread, OutputStream
    from macbatch.engine.sample.params import MAX_LOGPROBS, InvalidSamplingParam, SamplingParams
    from macbatch.engine.speculative.dflash_model import describe_dflash, is_dflash_config
    from macbatch.engine.speculative.eagle3_model import describe_eagle3, is_eagle3_config
    from macbatch.engine.speculative.methods import (
        DEFAULT_SPECULATIVE_TOKENS,
        DRAFT_MODEL_METHODS,
        SPECULATIVE_MODES,
        check_speculative,
    )
    from macbatch.engine.speculative.mtp_weights import describe_mtp_heads
    from macbatch.engine.stores.fp8_keys import check_indexer_keys
    from macbatch.engine.structured_output.constraints import StructuredOutput
    from macbatch.engine.tokenizer import Tokenizer
