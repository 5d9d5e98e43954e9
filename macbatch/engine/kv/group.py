"""The cache group protocol: what the KV manager asks of every kind of cache a model keeps, so
that it coordinates them in one loop and a new kind is one module and one registry entry
(``registry.py``).

After vLLM v1's ``KVCacheSpec`` and ``SingleTypeKVCacheManager``: a spec (a frozen dataclass) says
what the model needs of a group (its bytes per block, its window), and the group keeps that for
every request: full attention's blocks (``full.py``), a sliding window's (``window.py``), a
recurrent state's slot and checkpoints (``recurrent_state.py``). Every group counts in the full
group's blocks: a request's token at position p is in block ``p // block_size`` of each block
group's table, and the prefix cache names block i of every group by the same chain digest
(``block_pool.chain_block_hashes``), so one chain finds a cached prefix and each group says how
much of it it can resume after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from macbatch.engine.model.recurrent import StateChunk

if TYPE_CHECKING:
    import mlx.core as mx
    import numpy as np

    from macbatch.engine.kv.tables import RowTables


@dataclass(frozen=True)
class CacheSpec:
    """What a model needs of one cache group: a subclass per kind, with the kind's numbers. The
    model runner declares one per group; ``registry.CACHE_GROUPS`` maps its type to the group
    class that keeps it."""


class HasId(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def num_prompt_tokens(self) -> int: ...


class Chunk(Protocol):
    """What a group reads of one chunk of a step (``ScheduledChunk``)."""

    @property
    def request(self) -> HasId: ...

    @property
    def start(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_drafts(self) -> int: ...


@dataclass(slots=True)
class StepTables:
    """What the packer reads of the cache groups for one step, each in the step's chunk order;
    each group fills its own part (``CacheGroup.add_tables``), the model runner packs them."""

    blocks: list[list[int]] = field(default_factory=list)  # the full group's block tables
    window: list[list[int]] | None = None  # the window group's, when the model has one
    states: list[StateChunk] | None = None  # how each chunk's recurrent state flows (hybrids)
    # each compressed-rows group's row block tables, by its compress ratio (DeepSeek V4)
    rows: dict[int, RowTables] = field(default_factory=dict)
    open_groups: list[StateChunk] | None = None  # how each chunk's open-group state flows


class CacheGroup(Protocol):
    """One kind of cache, kept for every request. Each group owns its own pool (block ids or
    state rows), so room found in one is never taken by another."""

    # True: a request's room here is taken once, at its first allocation (which always takes a
    # full-group block), so the KV manager skips the group on steps whose full-group blocks
    # already have room (most decode steps). False: it is asked on every allocation.
    per_request: bool

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        """Whether the request's ``num_blocks`` blocks (its first ``num_computed`` tokens
        computed) fit now, growing an elastic pool if they do not and giving back what the
        request no longer needs; takes nothing, so the manager can ask every group before any
        takes (all-or-nothing)."""
        ...

    def allocate(self, request_id: str, num_blocks: int) -> None:
        """Take the room ``make_room`` found."""
        ...

    def free(self, request_id: str) -> None:
        """Give back everything the request holds (what the prefix cache names stays findable)."""
        ...

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        """The most leading blocks of a cached prefix (``hashes``: its chain digests) this
        group can resume after; takes nothing."""
        ...

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        """Take what resuming after the first ``num_blocks`` blocks of ``hashes`` (the cached
        prefix found, every group having agreed on ``num_blocks``) needs here."""
        ...

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        """Name the request's blocks ``first..`` in the prefix cache: ``hashes`` is its chain so
        far, ``first`` the first digest new since the last call."""
        ...

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        """Fill this group's part of a step's tables for ``chunks``."""
        ...

    @property
    def bytes_used(self) -> int:
        """Bytes of its memory holding something now: held by requests or the prefix cache."""
        ...

    def shrink(self) -> int:
        """Back to its start size when no request holds anything (``ElasticPool.shrink``);
        returns the blocks given back (a group without blocks: 0)."""
        ...

    def disk_part(self) -> DiskPart | None:
        """What it keeps of a cached prefix in the disk tier (None: nothing, so the tier can
        never resume a prefix the group needs: the engine runs without it)."""
        ...


class DiskPart(Protocol):
    """A cache group's part of a cached prefix on disk (``kv/disk/``): for each block of the
    prefix cache's chain, what the group holds under that digest (a block of its pages, or a
    recurrent state's checkpoint), as bytes. The disk tier loops over the groups' parts, so a
    new kind that keeps something is its part here, not a branch in the tier."""

    # names its files (a different tag never reads them); "" for the full group's blocks
    tag: str
    # whether ``gather``'s arrays are buffers of their own (a gather by index), which the disk
    # writer reads in place; False: they may be slices of the group's memory, copied out on the
    # engine thread (a view would keep the whole array alive, and copied on its next update)
    gathers_own_buffers: bool
    # whether every digest's part has ``slab_bytes``'s sizes; False: each is one payload of its
    # own length (its file's), ``gather`` making one ``[bytes]`` uint8 array per place and
    # ``restore`` taking one per digest (held library caches, whose rows grow with the context)
    sized: bool

    def slab_bytes(self) -> list[int]:
        """Bytes of one digest's part in each of its arrays (its file holds them in order;
        none for a part that is not ``sized``)."""
        ...

    def needs(self, num_blocks: int) -> range:
        """The indices of the chain's blocks whose part resuming after ``num_blocks`` blocks
        needs (full attention: every one; a window: the window before; a recurrent state: the
        checkpoint after the last)."""
        ...

    def lookup(self, digest: bytes) -> int | None:
        """Where its part of ``digest`` is in memory now (a block id or a state row; None: not
        held). Changes no recency."""
        ...

    def gather(self, places: Sequence[int]) -> list[mx.array]:
        """The parts at ``places`` as bytes, ``[len(places), slab]`` uint8 per array (lazy)."""
        ...

    def restore(
        self, digests: Sequence[bytes], slabs: Sequence[np.ndarray], keep: Sequence[bytes]
    ) -> int:
        """Put parts read from disk (``slabs[i]``: ``[len(digests), slab]`` uint8, as
        ``gather`` made them) into fresh places named under ``digests`` and idle in the prefix
        cache, evicting none of ``keep``'s; how many (from the first) found room."""
        ...
