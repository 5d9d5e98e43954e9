"""Block tables as the arrays a step hands its kernels: here, where the cache groups that make
the tables live, so the packer (``core/packing.py``) and a group whose tables a kernel reads
apart from the full group's (``compressed_rows.py``) build them one way."""

from __future__ import annotations

import itertools

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
