"""The open-group state of DeepSeek V4's compressors: per request, each compressor's projections
(``wkv`` and ``wgate`` of a token, float32) of the tokens no compressed row has pooled yet, up
to ``m - 1`` (the open group's); an overlapping compressor (m = 4 in V4 as released: a row
pools its group's tokens and the previous group's) also keeps the previous closed group's, up to
``2m - 1``. The next row that closes pools them, so a chunk starts from them and leaves its own.

They cannot be recomputed from what the pages keep (the window's rows and the compressed rows
are other projections of other norms), and recomputing them from the last tokens' hidden states
would mean running every layer over those tokens again on resume, rewriting rows a prefix hit
shares; so they are a state, kept as a recurrent state is: a request slot in the runner's
``StateStore`` (one row per request, every compressor's arrays in it: ``open_group_shape``),
and the prefix cache's checkpoints at block boundaries (``checkpoints.py``), named by the digest
of the block that ends their prefix, on the disk tier as checkpoints of their own tag. The
compressed rows' group resumes a prefix after any block boundary (``compressed_rows.py``), so the
checkpoints decide where a prefix resumes, as for a hybrid's recurrent state.

A step's part is each chunk's ``StateChunk`` (``StepTables.open_groups``): the row its state
starts from (its slot, the checkpoint it resumes after, or -1: nothing, at position 0), its
slot, and the checkpoint it fills after its first ``checkpoint_at`` tokens. How many of a
state's leading entries hold tokens follows from the position (``held_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from macbatch.engine.kv.disk.parts import OpenGroupsPart
from macbatch.engine.kv.group import Chunk, StepTables
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup, RecurrentStateSpec
from macbatch.engine.stores.state_store import StateShape


def open_tokens(ratio: int, overlap: bool) -> int:
    """The most tokens a compressor's state holds: the open group's, and with ``overlap`` the
    previous closed group's."""
    return ratio - 1 + (ratio if overlap else 0)


def held_tokens(position: int, ratio: int, overlap: bool) -> int:
    """The tokens a compressor's state holds once the first ``position`` tokens are computed:
    those of the group still open, after the previous closed group's with ``overlap`` (oldest
    first: positions ``position - held_tokens(...)`` to ``position - 1``)."""
    return position % ratio + (ratio if overlap and position >= ratio else 0)


def open_group_shape(ratio: int, overlap: bool, width: int) -> StateShape:
    """One compressor's state: its ``wkv`` and ``wgate`` projections (``width`` each) of the
    tokens it holds, in float32 as the libraries keep them, oldest first."""
    rows = (open_tokens(ratio, overlap), width)
    return StateShape((rows, rows), (mx.float32, mx.float32))


@dataclass(frozen=True)
class OpenGroupsSpec(RecurrentStateSpec):
    """``bytes_per_state``: every compressor's state of one sequence."""


class OpenGroupsGroup(RecurrentStateGroup):
    """A recurrent state's slots and checkpoints, handed to the step as the open groups'."""

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        tables.open_groups = [self._flow(c) for c in chunks]

    def disk_part(self) -> OpenGroupsPart | None:
        """The checkpoint after a prefix's last block (None: prefix caching is off)."""
        if self.checkpoints is None:
            return None
        return OpenGroupsPart(self.checkpoints, self.slots.store)
