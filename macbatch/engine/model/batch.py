"""The packed batch: one step's arrays, every token its own row of the (N, 1) model input. The
shape every forward reads (the adapter, the draft model, an MTP layer, the distributed channel);
``core/packing.py`` builds it from a step plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import mlx.core as mx

from macbatch.engine.model.attention_chunks import chunked
from macbatch.engine.model.image_blocks import StepBlocks
from macbatch.engine.model.recurrent import StateRows
from macbatch.metal import AttentionMetadata


@dataclass
class PackedBatch:
    # [N] int32 (uint32 when the engine takes a decode-only step's inputs straight from the
    # previous step's samples: the embedding gathers either)
    token_ids: mx.array
    positions: mx.array  # [N] int32, each token's position in its sequence
    cu_seqlens_q: mx.array  # [S+1] int32
    seq_lens: mx.array  # [S] int32, context length after this step
    block_tables: mx.array  # [S, width] int32 (padding: block 0, never read)
    kv_write_rows: dict[int, mx.array]  # num_kv_heads -> [N * Hkv] flat page rows to write
    sample_rows: mx.array  # [R] rows whose logits are sampled
    num_tokens: int
    pending_rows: list[int]  # rows whose token is pending (filled on the device)
    pending_chunks: list[int]  # the plan's chunk index of each pending row
    # A hybrid model's recurrent layers: which rows form which sequence, and their state slots
    # (every rank keeps its heads' share of every slot).
    state_rows: StateRows | None = None
    # 1 when rank 0 reads every row's last hidden state (an MTP layer drafts from them): then
    # every rank runs the last layer's collectives, even in a step that samples no row.
    reads_hidden: int = 0
    # [N] uint32: each row's adapter slot (engine/lora/), None when every row is the base model's
    adapter_rows: mx.array | None = field(default=None, metadata={"rank_local": True})
    # The window group's (sliding-window layers) block tables and write rows, when the model has
    # one: its own block ids, block 0 where a block left every window (never read). Rank 0's
    # alone (a distributed engine keeps every layer in the full group).
    window_block_tables: mx.array | None = field(default=None, metadata={"rank_local": True})
    window_write_rows: dict[int, mx.array] | None = field(
        default=None, metadata={"rank_local": True}
    )

    # Image rows (vision models): the rows whose input is an image embedding, not their token's.
    # Rank 0's alone (the engine sets them after packing, from its vision encoder).
    image_rows: mx.array | None = field(default=None, metadata={"rank_local": True})
    image_embeddings: mx.array | None = field(default=None, metadata={"rank_local": True})
    # Gemma 4's image blocks in this step, whose rows attend both ways
    # (engine/model/image_blocks.py).
    image_blocks: StepBlocks | None = field(default=None, metadata={"rank_local": True})
    # [N, 3] M-RoPE positions (engine/multimodal/qwen_vl.py) when a row's request has them, else
    # None.
    rope_positions: mx.array | None = field(default=None, metadata={"rank_local": True})
    # [N] int32: 1 where a row's request is rotated by the long factors, when the model has a
    # LongRoPE (model/hooks/long_rope.py; the scheduler decides: Request.long_rope), else None.
    long_rope_rows: mx.array | None = None

    @cached_property
    def attention(self) -> AttentionMetadata:
        """What every full-attention layer reads of this step, made once per step on first use
        (a property, not a field: the distributed channel sends the fields as they are)."""
        return AttentionMetadata.build(self.block_tables, self.seq_lens, self.cu_seqlens_q)

    @cached_property
    def window_attention(self) -> AttentionMetadata:
        """What every sliding-window layer reads of this step: the window group's tables."""
        assert self.window_block_tables is not None
        return AttentionMetadata.build(self.window_block_tables, self.seq_lens, self.cu_seqlens_q)

    @cached_property
    def _chunked_attention(self) -> dict[int, AttentionMetadata]:
        return {}

    def chunk_attention(self, chunk: int, block_size: int) -> AttentionMetadata:
        """What a chunked-attention layer (Llama 4's) reads of this step: the full group's
        sequences cut at every multiple of ``chunk`` (``attention_chunks.py``), made once per
        step and chunk size."""
        made = self._chunked_attention
        if chunk not in made:
            made[chunk] = chunked(self.attention, chunk, block_size)
        return made[chunk]
