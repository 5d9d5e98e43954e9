"""The compressed-rows cache group: DeepSeek V4's compressed attention keeps one row per ``m``
tokens per layer (``m`` its layer's compress ratio: 4 for CSA, 128 for HCA), so its pages are
addressed by row, not by token position, and a group holds the rows of every layer with one
ratio (a model with ratios 4 and 128 has two groups).

A row block holds ``rows_per_block`` rows: ``block_size / m`` when the ratio divides the token
block size, else one (the ratio a multiple of it). So a row block spans ``span`` token blocks
(one for m = 4, ``m / block_size`` for m = 128), it is full exactly when its last token block
is, and every token block boundary ends a whole number of row blocks: a request resuming a
cached prefix after any block boundary shares whole row blocks and writes its next row into a
fresh one (a block is only ever written by the request that took it). Row block k is named in
the prefix cache by the chain digest of the token block that closes it, ``(k + 1) * span - 1``,
so resuming after n token blocks needs row blocks ``0 .. n // span - 1``, found under those
digests. A request takes row blocks as its rows accumulate (at most one ahead of its rows: the
full group's blocks the step allocates bound its tokens), so memory is proportional to rows.

The rows not yet pooled (the open group's tokens' projections) are not here: they are a
per-request state (``open_groups.py``), and the KV manager resumes a prefix only where both
agree. A CSA layer's indexer keys are compressed rows too: store layers of their own in the
same pages (``LayerShape.value_dim`` 0), as ``indexer_keys.py`` keeps DeepSeek V3.2's beside its
latent rows. A step's part is each chunk's row block table (``RowTables``), which the kernel's
compressed source reads with ``rows_per_block``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from macbatch.arithmetic import ceil_div
from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.disk.parts import BlockPages, BlockPart
from macbatch.engine.kv.elastic import ElasticPool, PagedMemory
from macbatch.engine.kv.group import CacheSpec, Chunk, StepTables
from macbatch.engine.kv.tables import RowTables
from macbatch.engine.stores.pages import LayerShape, PageFormat


def rows_per_block(ratio: int, block_size: int) -> int:
    """Rows in a row block, so that every token block boundary ends whole row blocks: the
    token block's rows, or one row when a row spans several token blocks."""
    if block_size % ratio and ratio % block_size:
        raise ValueError(
            f"a compress ratio of {ratio} neither divides nor is a multiple of "
            f"the block size {block_size}"
        )
    return max(1, block_size // ratio)


@dataclass(frozen=True)
class CompressedRowsSpec(CacheSpec):
    ratio: int  # m: tokens pooled into one row
    rows_per_block: int  # ``rows_per_block(ratio, block_size)``
    bytes_per_block: int  # its layers' rows of one row block, indexer keys and scales included
    index_bytes_per_block: int = 0  # the indexer keys' part of it

    @property
    def bytes_per_token(self) -> float:
        """What its rows cost per token of context: a row's bytes over ``ratio`` tokens."""
        return self.bytes_per_block / (self.rows_per_block * self.ratio)


def compressed_rows_spec(
    shapes: Sequence[LayerShape], fmt: PageFormat, ratio: int, block_size: int
) -> CompressedRowsSpec:
    """The spec of a group whose pages are ``shapes`` (its layers' rows: ``value_dim`` set,
    indexer keys' ``value_dim`` 0) in ``fmt``."""
    per_block = rows_per_block(ratio, block_size)
    keys = [s for s in shapes if s.indexer_keys]
    return CompressedRowsSpec(
        ratio,
        per_block,
        fmt.bytes_per_block(list(shapes), per_block),
        fmt.bytes_per_block(keys, per_block),
    )


class CompressedRowsGroup:
    per_request = False  # its rows grow with the context: asked on every allocation

    def __init__(self, spec: CompressedRowsSpec, memory: PagedMemory, block_size: int) -> None:
        if spec.rows_per_block != rows_per_block(spec.ratio, block_size):
            raise ValueError(
                f"{spec.rows_per_block} rows per block with a ratio of "
                f"{spec.ratio} over blocks of {block_size} tokens"
            )
        self.spec = spec
        self.ratio = spec.ratio
        self.rows_per_block = spec.rows_per_block
        self.block_size = block_size
        self.span = spec.rows_per_block * spec.ratio // block_size  # token blocks per row block
        self.pool = BlockPool(memory.size.start)
        self.elastic = ElasticPool(self.pool, memory.pages, memory.size)
        self._tables: dict[str, list[int]] = {}

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def row_blocks(self, num_tokens: int) -> int:
        """Row blocks holding the rows of ``num_tokens`` tokens (one per ``ratio`` closed)."""
        return ceil_div(num_tokens // self.ratio, self.rows_per_block)

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        """Room for the rows of the ``num_blocks`` token blocks' tokens."""
        missing = self.row_blocks(num_blocks * self.block_size) - len(self.block_table(request_id))
        return missing <= self.pool.num_free or self.elastic.make_room(missing)

    def allocate(self, request_id: str, num_blocks: int) -> None:
        table = self._tables.setdefault(request_id, [])
        needed = self.row_blocks(num_blocks * self.block_size)
        table.extend(self.pool.allocate() for _ in range(needed - len(table)))

    def free(self, request_id: str) -> None:
        """The last block first, so a prefix's earlier rows stay cached longest."""
        for block in reversed(self._tables.pop(request_id, [])):
            self.pool.free(block)

    def closing(self, row_block: int) -> int:
        """The chain index of the token block that closes row block ``row_block`` (the digest
        naming it)."""
        return (row_block + 1) * self.span - 1

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        """The most leading token blocks of ``hashes`` whose closed row blocks are cached: up to
        the block before the first missing row block's closing one."""
        cached = 0
        while self.closing(cached) < len(hashes):
            if self.pool.lookup(hashes[self.closing(cached)]) is None:
                return self.closing(cached)
            cached += 1
        return len(hashes)

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        """Share the row blocks the first ``num_blocks`` token blocks closed."""
        blocks = []
        for k in range(num_blocks // self.span):
            block = self.pool.lookup(hashes[self.closing(k)])
            assert block is not None, "found cached, and nothing was taken since"
            self.pool.share(block)
            blocks.append(block)
        if blocks:
            self._tables[request_id] = blocks

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        """Name the row blocks closed by the token blocks ``first..`` of ``hashes``."""
        table = self._tables.get(request_id, [])
        closed = min(len(hashes) // self.span, len(table))
        for k in range(first // self.span, closed):
            self.pool.register(table[k], hashes[self.closing(k)])

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        rows = [self._tables.get(c.request.request_id, []) for c in chunks]
        tables.rows[self.ratio] = RowTables(self.ratio, self.rows_per_block, rows)

    @property
    def bytes_used(self) -> int:
        return self.pool.num_occupied * self.spec.bytes_per_block

    def shrink(self) -> int:
        return 0 if self._tables else self.elastic.shrink()

    def disk_part(self) -> BlockPart:
        """The row blocks a resume point's token blocks closed: its layers' rows (the ratio
        names the files: another group's never read them)."""
        pages = cast("BlockPages", self.elastic.pages)
        return BlockPart(f"rows{self.ratio}", self.elastic, pages, self._closed_before)

    def _closed_before(self, num_blocks: int) -> range:
        """The chain indices naming the row blocks closed in the first ``num_blocks`` blocks."""
        return range(self.span - 1, num_blocks // self.span * self.span, self.span)
