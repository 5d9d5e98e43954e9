"""What the engine decides once at load, from its model runner: the model's facts (``ModelInfo``,
``EngineInfo``) and the KV manager over the runner's pools (the full group's blocks, a
sliding-window group's, a hybrid model's state slots and checkpoints, and whether the pools grow).
Kept apart from the engine core, whose job is the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from macbatch.engine.config import EngineConfig
from macbatch.engine.inputs.chat_template import thinking_default
from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.elastic import ElasticPool
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.state_slots import StateSlots
from macbatch.engine.kv.window import WindowBlocks
from macbatch.engine.model_info import EngineInfo, ModelInfo
from macbatch.engine.parsers.reasoning import ReasoningFormat
from macbatch.engine.parsers.tool_formats.detect import detect_tool_format
from macbatch.engine.pooling.embedding_profile import profile_of
from macbatch.engine.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def kv_manager_for(
    runner: ModelRunner, config: EngineConfig, model_name: str
) -> tuple[BlockPool, BlockPool | None, KVManager]:
    """The full group's block pool, the window group's (None without one), and the KV manager
    that owns them and a hybrid model's state slots."""
    pool = BlockPool(runner.pool_size.start)
    elastic = None
    if runner.pool_size.elastic:
        elastic = ElasticPool(pool, runner.full_pages, runner.pool_size)
    prefix_root = f"{model_name}:{runner.model_type}".encode()
    slots = None  # a hybrid model's state slots and its prefix cache's checkpoints
    if runner.states is not None and runner.state_sizes is not None:
        slots = StateSlots(runner.states, runner.state_sizes)
    window_pool, window = _window_group(runner, config.block_size)
    kv = KVManager(
        pool,
        config.block_size,
        prefix_root if config.enable_prefix_caching else None,
        slots,
        None if slots is None else slots.checkpoints,
        elastic,
        window,
    )
    return pool, window_pool, kv


def _window_group(
    runner: ModelRunner, block_size: int
) -> tuple[BlockPool | None, WindowBlocks | None]:
    """The sliding-window layers' block pool and block tables (None, None: the model has no
    window group)."""
    size, store, window = runner.window_pool_size, runner.window_store, runner.adapter.window
    if size is None or store is None or window is None:
        return None, None
    pool = BlockPool(size.start)
    elastic = ElasticPool(pool, store, size) if size.elastic else None
    return pool, WindowBlocks(pool, block_size, window, elastic)


def model_info_of(name: str, runner: ModelRunner, tokenizer: TokenizerWrapper) -> ModelInfo:
    """The model's facts, decided here once: the runner's from the weights, the rest from the
    tokenizer and its chat template."""
    return ModelInfo(
        name=name,
        model_type=runner.model_type,
        vocab_size=runner.vocab_size,
        max_model_len=runner.context_length,
        tool_format=detect_tool_format(tokenizer),
        reasoning_format=ReasoningFormat.of(tokenizer),
        thinking_default=thinking_default(tokenizer),
        kv_bytes_per_token=runner.kv_bytes_per_token,
        embedding=profile_of(tokenizer, name, runner.hidden_size, runner.config.reranker),
    )


def engine_info_of(model: ModelInfo, config: EngineConfig, num_blocks: int) -> EngineInfo:
    """``num_blocks``: the pool's cap, so that no request is refused for room the pool has not
    grown into yet."""
    capacity = num_blocks * config.block_size
    fits = model.max_model_len <= capacity
    return EngineInfo(
        model=model,
        block_size=config.block_size,
        kv_blocks_cap=num_blocks,
        context_limit=model.max_model_len if fits else capacity,
        context_limit_reason="the model's context length" if fits else "the whole KV cache pool",
    )
