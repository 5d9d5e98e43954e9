"""The cache kinds: which group class keeps each spec a model runner declares. A new kind is
its module (its spec and its group, following ``group.CacheGroup``) and one entry here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from macbatch.engine.kv.compressed_rows import CompressedRowsGroup, CompressedRowsSpec
from macbatch.engine.kv.full import FullAttentionGroup, FullAttentionSpec
from macbatch.engine.kv.group import CacheGroup, CacheSpec
from macbatch.engine.kv.held_state import HeldStateGroup, HeldStateSpec
from macbatch.engine.kv.indexer_keys import IndexerKeysGroup, IndexerKeysSpec
from macbatch.engine.kv.latent import LatentGroup, LatentSpec
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.open_groups import OpenGroupsGroup, OpenGroupsSpec
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup, RecurrentStateSpec
from macbatch.engine.kv.window import SlidingWindowGroup, SlidingWindowSpec

# each group class is built from its spec, the memory the runner gave it, and the block size
CACHE_GROUPS: dict[type[CacheSpec], Callable[..., CacheGroup]] = {
    FullAttentionSpec: FullAttentionGroup,
    LatentSpec: LatentGroup,
    IndexerKeysSpec: IndexerKeysGroup,
    SlidingWindowSpec: SlidingWindowGroup,
    RecurrentStateSpec: RecurrentStateGroup,
    HeldStateSpec: HeldStateGroup,
    CompressedRowsSpec: CompressedRowsGroup,
    OpenGroupsSpec: OpenGroupsGroup,
}


def kv_manager(
    declared: Sequence[tuple[CacheSpec, object]], block_size: int, prefix_root: bytes | None
) -> KVManager:
    """The KV manager over a group for each ``(spec, memory)`` a runner declares (the
    full-attention group first); ``prefix_root`` None: prefix caching off."""
    groups = [CACHE_GROUPS[type(spec)](spec, memory, block_size) for spec, memory in declared]
    return KVManager(groups, block_size, prefix_root)
