"""The attention contract's types: what a step hands every layer, what a layer adds, and the
protocol every attention backend implements (the registry of them is in ``registry.py``).

Two objects instead of ten loose arguments, split by lifetime: `AttentionMetadata` is the step's
(one per packed forward, shared by every layer), `LayerParams` the layer's (its scale, window,
softcap, sinks, sparse list and second source of rows). The function both describe is written
out in ``reference.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

import mlx.core as mx
import numpy as np

from macbatch.metal.quant import QuantizedPages

Pages = mx.array | QuantizedPages


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """The step's sequences as attention sees them, on the device and on the host.

    Sequence ``s`` owns query rows ``cu_seqlens_q[s]:cu_seqlens_q[s+1]``, has ``seq_lens[s]``
    tokens of context after this step, and keeps them in the blocks listed in
    ``block_tables[s]`` (padded with block 0, never read). All int32. The host copies exist
    because every backend plans its work with numpy; holding them here converts them once per
    step rather than once per layer. ``eq=False``: arrays do not compare to a bool.
    """

    block_tables: mx.array  # [S, max_blocks]
    seq_lens: mx.array  # [S]
    cu_seqlens_q: mx.array  # [S + 1]
    host_seq_lens: np.ndarray  # seq_lens, as numpy
    host_cu_seqlens_q: np.ndarray  # cu_seqlens_q, as numpy

    @classmethod
    def build(
        cls,
        block_tables: mx.array | np.ndarray,
        seq_lens: mx.array | np.ndarray,
        cu_seqlens_q: mx.array | np.ndarray,
    ) -> AttentionMetadata:
        """From numpy or MLX arrays of any integer type; int32 MLX arrays are kept as they are
        (a conversion would add an op to the step's graph)."""
        return cls(
            _int32(block_tables),
            _int32(seq_lens),
            _int32(cu_seqlens_q),
            np.asarray(seq_lens, dtype=np.int32),
            np.asarray(cu_seqlens_q, dtype=np.int32),
        )


class RowSource(NamedTuple):
    """A second source of key rows read in the same softmax as the paged tokens (DeepSeek V4's
    compressed rows, docs/kernel.md "Two sources"): rows addressed by index, not position, in
    pages of their own, so the caller decides which a query row reads (no causal check here).

    ``pages``: ``[row_blocks, 1, rows_per_block, D]`` in the first source's page format (its
    float dtype, or its bits and group size), one KV head whose rows are keys and values alike
    (the values their leading ``LayerParams.value_dim`` columns, as on latent pages).
    ``block_table``: int32 ``[S, max_row_blocks]``, sequence s's row blocks (the metadata's
    sequence order; row r of s lies at row ``r % rows_per_block`` of block
    ``block_table[s, r // rows_per_block]``). ``selected``: int32 ``[N, K2]``, per query row the
    rows of its own sequence it reads, distinct, -1 for none.
    """

    pages: Pages
    block_table: mx.array
    selected: mx.array

    @property
    def rows_per_block(self) -> int:
        """The row pages' own block size, in rows (independent of the token pages')."""
        return int(self.pages.shape[2])


class LayerParams(NamedTuple):
    """One layer's own attention parameters. A tuple, not a dataclass: the engine builds one per
    layer per step, and a tuple costs a fifth of a frozen dataclass to make."""

    scale: float
    sliding_window: int | None = None  # attend to the last this many keys only
    softcap: float | None = None  # scores become tanh(score / softcap) * softcap
    sinks: mx.array | None = None  # [Hq] one extra logit per head, in the softmax only
    # Latent (MLA) pages: the values are the first ``value_dim`` columns of the key rows (the
    # caller passes the key pages as ``v_pages`` too), and each output row has that many.
    value_dim: int | None = None
    # Sparse attention (DeepSeek's lightning indexer, docs/kernel.md "Sparse attention"): int32
    # ``[N, K]``, the positions in its own sequence each query row attends to (-1: no entry);
    # None: every visible position
    selected: mx.array | None = None
    # A second source (DeepSeek V4's compressed rows) read in the same softmax; needs latent
    # pages (``value_dim`` set) of one KV head. None: the paged tokens only
    rows: RowSource | None = None


def check_row_source(
    q: mx.array, k_pages: Pages, meta: AttentionMetadata, layer: LayerParams
) -> int:
    """The entries per query row of a call's second source (``layer.rows``), after checking it
    fits the call: every backend refuses the same misuse with the same words."""
    rows = layer.rows
    assert rows is not None
    pages, table, selected = rows
    if layer.value_dim is None or k_pages.shape[1] != 1 or pages.shape[1] != 1:
        raise ValueError(
            "paged_attention: a second source of rows needs latent pages (value_dim set) of one "
            f"KV head, got value_dim {layer.value_dim}, {k_pages.shape[1]} KV heads and row "
            f"pages of {pages.shape[1]}"
        )
    if pages.ndim != 4 or pages.shape[3] != k_pages.shape[3] or _format(pages) != _format(k_pages):
        raise ValueError(
            "paged_attention: row pages must be [row_blocks, 1, rows_per_block, D] in the token "
            f"pages' format ({_format(k_pages)}, D = {k_pages.shape[3]}), got {_format(pages)} "
            f"{tuple(pages.shape)}"
        )
    if table.ndim != 2 or table.shape[0] != len(meta.host_seq_lens) or table.shape[1] == 0:
        raise ValueError(
            f"paged_attention: the row block table must be [S, max_row_blocks] with S = "
            f"{len(meta.host_seq_lens)} sequences, got {tuple(table.shape)}"
        )
    if selected.ndim != 2 or selected.shape[0] != q.shape[0] or selected.shape[1] == 0:
        raise ValueError(
            f"paged_attention: the rows' selected must be [N, K2] with N = {q.shape[0]} query "
            f"rows and K2 > 0, got {tuple(selected.shape)}"
        )
    return int(selected.shape[1])


def _format(pages: Pages) -> str:
    """A page format in words: its float dtype, or its bits and group size."""
    if isinstance(pages, QuantizedPages):
        return f"{pages.bits}-bit, groups of {pages.group_size}"
    return str(pages.dtype)


class BackendUnavailable(RuntimeError):
    """`AttentionBackend.prepare` cannot make the backend runnable here (no compiler, ...)."""


class AttentionBackend(Protocol):
    """One implementation of the attention contract of ``reference.py``.

    ``name`` is what ``MACBATCH_ATTENTION`` selects it by, ``label`` the words
    ``macbatch doctor`` prints. The defaults suit a backend that runs anywhere and builds
    nothing; subclass this protocol to inherit them.
    """

    name: ClassVar[str]
    label: ClassVar[str]

    def available(self) -> str | None:
        """None when this machine can run the backend, else why not (cheap: builds nothing)."""
        return None

    def prepare(self) -> None:
        """Build or compile what the backend needs, once; raise `BackendUnavailable` on
        failure. Runs before the start-up self-test."""
        return None

    def traceable(self, head_dim: int, block_size: int) -> bool:
        """Whether a call with these shapes reads the metadata only as arrays, at evaluation
        (never the host copies), so a graph traced once replays it correctly (``mx.compile``)."""
        return False

    def __call__(
        self, q: mx.array, k: Pages, v: Pages, meta: AttentionMetadata, layer: LayerParams, /
    ) -> mx.array:
        """Attention of packed query rows ``q [N, Hq, D]`` over each row's own paged context."""
        ...


def _int32(a: mx.array | np.ndarray) -> mx.array:
    """``a`` as an int32 MLX array; as it is when it already is one."""
    if isinstance(a, mx.array):
        return a if a.dtype == mx.int32 else a.astype(mx.int32)
    return mx.array(np.asarray(a, dtype=np.int32))
