"""DFlash drafting: a block-diffusion drafter proposes a whole block of tokens in one packed
forward over every speculating request, from the target's features at several of its layers
(docs/speculative.md, "DFlash").

The context K/V is written in the step that computes the target's features (``observe``): every
row of a request expected to draft soon, prompt chunks, decodes and verifications alike, in one
packed pass of ``fc``, ``hidden_norm`` and each layer's K/V
projections. So when a request holds
tokens ``0..n-1`` (the last not yet run by the target), its pages hold the context at positions
``0..n-2`` and the proposal is one forward of the block: token ``n-1`` then ``k`` mask tokens at
positions ``n-1..n-1+k``, attending to that context and to the block both ways (causally, where
the checkpoint's blocks are causal; a sliding layer within its window); its rows
``1..k`` are the drafts (a DSpark block is one mask shorter, its rows ``0..k-1`` the drafts).
The block's own K/V lands on positions the target computes next, whose
features overwrite it in that step; a verification's rows past the accepted drafts (features of
rejected tokens) are overwritten the same way when the target computes those positions again. A
position whose features the request never computed (a prefix-cache hit) or whose context pass
a request not expected to draft soon skipped (a prompt chunk, or decode rows while it rests)
keeps whatever its block holds. Drafts are greedy (a point
mass: verify.py), so what the drafter attends to changes how many drafts hold, never the output."""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import TYPE_CHECKING, cast

import mlx.core as mx

from macbatch.engine.core.packing import pack
from macbatch.engine.core.scheduler import ScheduledChunk, StepPlan
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.image_blocks import StepBlock, StepBlocks
from macbatch.engine.speculative.dflash_runner import DFlashRunner
from macbatch.engine.speculative.policy import may_draft

if TYPE_CHECKING:
    from macbatch.engine.core.request import Request


class DFlashDrafter:
    def __init__(self, runner: DFlashRunner, kv: KVManager) -> None:
        self.runner = runner
        self.kv = kv

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, drafting: Set[str]
    ) -> list[mx.array]:
        """Write the context K/V of the step's rows (``hidden``: the target's features) of the
        requests in ``drafting`` (expected to draft soon): that pass costs every step it runs
        in (``fc`` and each layer's K/V projections, a twentieth of a small target's row) and
        pays only if the request drafts. A resting request's rows are skipped, prompt or decode:
        its probe drafts over the context written before and after its rest. Returns the pages
        to evaluate with the step."""
        index: list[int] = []
        wanted: list[ScheduledChunk] = []
        row = 0
        for chunk in chunks:
            request = chunk.request
            if request.request_id in drafting and may_draft(request) and request.pooling is None:
                wanted.append(ScheduledChunk(request, chunk.start, chunk.num_tokens))
                index.extend(range(row, row + chunk.num_tokens))
            row += chunk.num_tokens
        if not wanted:
            return []
        batch = self._pack(wanted)
        self.runner.write_context(batch, hidden[mx.array(index)])
        return self.runner.arrays()

    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in requests]
        first = self.runner.first_draft_row
        live: list[tuple[int, list[int], int]] = []  # index, tokens, drafts
        for index, (request, k) in enumerate(zip(requests, ks)):
            k = min(k, self.runner.max_drafts)
            tokens = request.all_token_ids
            # the block's positions n-1..n-1+k (DSpark's one fewer): n - 1 computed, the rest new
            if k > 0 and self.kv.allocate_slots(request.request_id, len(tokens) - 1, k + first):
                live.append((index, tokens, k))
        if not live:
            return proposals
        chunks = [ScheduledChunk(requests[i], len(t) - 1, k + first) for i, t, k in live]
        batch, rows = self._blocks(chunks, [t[-1] for _, t, _ in live])
        within = mx.array([i for c in chunks for i in range(c.num_tokens)])
        anchors = mx.array([t[-1] for _, t, _ in live], dtype=mx.int32)
        lengths = [k for _, _, k in live]
        drafted = self.runner.draft(batch, within, rows, (anchors, lengths))
        mx.eval(drafted, *self.runner.arrays())
        tokens = cast(list[int], drafted.tolist())
        at = 0
        for index, _, k in live:
            proposals[index] = tokens[at : at + k]
            at += k
        return proposals

    def _blocks(
        self, chunks: list[ScheduledChunk], known: list[int]
    ) -> tuple[PackedBatch, mx.array]:
        """The packed batch of the blocks ``chunks`` (each its ``known`` token, then mask
        tokens), each block's rows attending both ways (unless its blocks are causal), and its
        draft rows, block after block."""
        batch = self._pack(chunks)
        mask, first = self.runner.mask_token_id, self.runner.first_draft_row
        batch.token_ids = mx.array(
            [x for c, t in zip(chunks, known) for x in [t] + [mask] * (c.num_tokens - 1)],
            dtype=mx.int32,
        )
        blocks: list[StepBlock] = []
        rows: list[int] = []
        offset = 0
        for seq, chunk in enumerate(chunks):
            blocks.append(StepBlock(seq, offset, chunk.start, chunk.start + chunk.num_tokens))
            rows.extend(range(offset + first, offset + chunk.num_tokens))
            offset += chunk.num_tokens
        if not self.runner.causal:  # causal blocks: the paged attention's own mask
            batch.image_blocks = StepBlocks(blocks, from_start=True)
        return batch, mx.array(rows)

    def _pack(self, chunks: list[ScheduledChunk]) -> PackedBatch:
        tables = [self.kv.block_table(c.request.request_id) for c in chunks]
        runner = self.runner
        return pack(StepPlan(chunks), tables, runner.block_size, runner.head_counts)

    def truncated(self, request_id: str, num_tokens: int) -> None:
        """Nothing to do: positions past ``num_tokens`` are written again when computed."""

    def forget(self, request_id: str) -> None:
        """Nothing kept per request: the context lives in its blocks."""
