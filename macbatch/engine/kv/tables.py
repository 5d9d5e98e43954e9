"""Block tables as the arrays a step hands its kernels: here, where the cache groups that make
the tables live, so the packer (``core/packing.py``) and a group whose tables a kernel reads
apart from the full group's (``compressed_rows.py``) build them one way."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def table_width(longest: int) -> int:
    """The block tables' width: the longest table rounded up to a power of two."""
    return 1 << max(0, longest - 1).bit_length()


def table_array(block_tables: list[list[int]]) -> np.ndarray:
    """``[S, width]`` int32, each table left-aligned, padded with block 0 (never read); the
    width is the longest table's rounded up to a power of two, so a growing context changes
    the step's shapes only when it doubles (a compiled step is traced per shape)."""
    lengths = np.fromiter(map(len, block_tables), np.int64, len(block_tables))
    flat = np.fromiter(itertools.chain.from_iterable(block_tables), np.int32, int(lengths.sum()))
    tables = np.zeros((len(block_tables), table_width(int(lengths.max()))), dtype=np.int32)
    tables[np.arange(tables.shape[1]) < lengths[:, None]] = flat  # row-major: rows in order
    return tables


@dataclass(frozen=True)
class RowTables:
    """A compressed-rows group's part of a step: each chunk's row block table (in the step's
    chunk order), what the kernel's compressed source and the compressor's writes read."""

    ratio: int
    rows_per_block: int
    tables: list[list[int]]

    def array(self) -> np.ndarray:
        """``[num_seqs, max_row_blocks]`` int32, padded with block 0 (never read)."""
        return table_array(self.tables)

    def flat_rows(self, seq: int, first: int, count: int) -> np.ndarray:
        """The page rows (a ``KVStore`` layer's flat rows: one KV head) of rows ``first`` to
        ``first + count - 1`` of chunk ``seq``'s sequence, where its compressor writes them."""
        rows = np.arange(first, first + count)
        blocks = np.asarray(self.tables[seq], np.int64)[rows // self.rows_per_block]
        return (blocks * self.rows_per_block + rows % self.rows_per_block).astype(np.int32)
