"""What the engine decides once at load, from its model runner: the model's facts (``ModelInfo``,
``EngineInfo``) and the KV manager over the cache groups the runner declares (each built by its
kind's entry in ``kv/registry.py``). Kept apart from the engine core, whose job is the step."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from macbatch.engine.config import EngineConfig
from macbatch.engine.inputs.chat_template import thinking_default
from macbatch.engine.kv.disk.setup import namespace_of, open_disk_tier
from macbatch.engine.kv.disk.tier import DiskTier
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.registry import kv_manager
from macbatch.engine.model_info import EngineInfo, ModelInfo
from macbatch.engine.parsers.reasoning import ReasoningFormat
from macbatch.engine.parsers.tool_formats.detect import detect_tool_format
from macbatch.engine.pooling.embedding_profile import profile_of
from macbatch.engine.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

log = logging.getLogger("macbatch.disk_cache")


def kv_manager_for(runner: ModelRunner, config: EngineConfig, model_name: str) -> KVManager:
    """The KV manager over a cache group for each one the runner declares, and the disk tier
    below its prefix cache when ``config.disk_cache_dir`` asks for one."""
    prefix_root = f"{model_name}:{runner.model_type}".encode()
    root = prefix_root if config.enable_prefix_caching else None
    manager = kv_manager(runner.cache_groups, config.block_size, root)
    if config.disk_cache_dir is not None and root is not None:
        manager.disk = disk_tier_for(runner, config, model_name, manager, root)
    return manager


def disk_tier_for(
    runner: ModelRunner, config: EngineConfig, model_name: str, manager: KVManager, root: bytes
) -> DiskTier | None:
    """The disk tier over every cache group's part of a prefix, or None (with why, logged)
    for what it does not keep: a distributed group, or a group that keeps nothing on disk."""
    assert config.disk_cache_dir is not None
    parts = [group.disk_part() for group in manager.groups]
    why = None
    if runner.group is not None:
        why = "a distributed group pages its shards (each rank would need its own files)"
    elif any(part is None for part in parts):
        why = "a cache group of the model keeps nothing on disk"
    if why is not None:
        log.warning("disk KV cache off: %s (not kept on disk yet)", why)
        return None
    namespace = namespace_of(
        runner.adapter, runner.store, runner.window_store, runner.states, model_name, root
    )
    pool_cap_bytes = runner.pool_size.cap * manager.full.spec.bytes_per_block
    return open_disk_tier(
        config.disk_cache_dir,
        config.disk_cache_bytes,
        namespace,
        [part for part in parts if part is not None],
        pool_cap_bytes,
    )


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
        adapters={} if runner.adapters is None else runner.adapters.refs,
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
