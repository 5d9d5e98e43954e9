"""A dispatched step the host has not read yet, and how the next step takes its sampled tokens
as input on the device (docs/engine.md, "The pipelined step")."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from macbatch.engine.core.request import Request
from macbatch.engine.core.scheduler import StepPlan
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.sample.sampler import SampledBatch


@dataclass
class InFlightStep:
    """A dispatched step whose sampled tokens the host has not read yet."""

    requests: list[Request]  # in sample-row order
    sampled: SampledBatch | None
    step: int
    # Per request, the drafts its rows verify (None: no request speculated): request i has
    # ``1 + len(drafts[i])`` rows.
    drafts: list[list[int]] | None = None
    pooled: list[tuple[Request, mx.array]] = field(default_factory=list)  # finished pooling

    def row_of(self) -> dict[str, int]:
        return {r.request_id: i for i, r in enumerate(self.requests)}


def feed_sampled_tokens(batch: PackedBatch, plan: StepPlan, previous: InFlightStep) -> None:
    """Fill the pending rows' input tokens from the previous step's samples, on the device. A
    decode-only step over exactly the requests the previous step sampled, in its order (steady
    decoding), takes those samples as its input as they are: no gather, no scatter."""
    assert previous.sampled is not None
    every_row_pending = len(batch.pending_rows) == batch.num_tokens
    if every_row_pending and [c.request for c in plan.chunks] == previous.requests:
        batch.token_ids = previous.sampled.tokens
        return
    row_of = previous.row_of()
    sources = [row_of[plan.chunks[i].request.request_id] for i in batch.pending_chunks]
    tokens = previous.sampled.tokens[mx.array(sources)].astype(mx.int32)
    batch.token_ids[mx.array(batch.pending_rows)] = tokens
