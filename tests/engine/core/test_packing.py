"""Packing a step plan into the forward's arrays, against a token-by-token oracle written from
the definitions (docs/engine.md, DESIGN.md "The step"): a mixed step of decodes (one with its
token pending), a prompt chunk that completes its prompt and one that does not."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine.core import packing
from macbatch.engine.core.packing import pack
from macbatch.engine.core.scheduler import ScheduledChunk, StepPlan
from tests.support.fake_requests import make_request

BLOCK = 4
HEAD_COUNTS = {1, 2}


def _mixed_plan() -> tuple[StepPlan, list[list[int]]]:
    decode = make_request([11, 12, 13, 14, 15])
    decode.output_token_ids += [16, 17]  # 7 tokens, 6 computed: decodes token 17
    pending = make_request([21, 22, 23, 24])
    pending.output_token_ids.append(25)
    pending.num_pending = 1  # token 6 sampled by the step in flight: not on the host yet
    whole = make_request([31, 32, 33])  # a prompt that fits: its last row samples
    partial = make_request(list(range(41, 51)))  # 10 tokens, chunk 4..7: no sample
    plan = StepPlan(
        [
            ScheduledChunk(decode, 6, 1),
            ScheduledChunk(pending, 5, 1),
            ScheduledChunk(whole, 0, 3),
            ScheduledChunk(partial, 4, 4),
        ]
    )
    tables = [[7, 3], [5, 9], [2], [0, 8, 6]]
    return plan, tables


def _oracle(plan: StepPlan, tables: list[list[int]]) -> dict[str, list]:
    """Every field, one token at a time."""
    tokens, positions, rows, samples, pending = [], [], {h: [] for h in HEAD_COUNTS}, [], []
    cu, seq_lens = [0], []
    for chunk, table in zip(plan.chunks, tables):
        request = chunk.request
        everything = request.prompt_token_ids + request.output_token_ids
        for position in range(chunk.start, chunk.start + chunk.num_tokens):
            if position < len(everything):
                tokens.append(everything[position])
            else:
                tokens.append(0)
                pending.append(len(positions))
            block, offset = table[position // BLOCK], position % BLOCK
            for hkv, flat in rows.items():
                flat += [(block * hkv + h) * BLOCK + offset for h in range(hkv)]
            positions.append(position)
        cu.append(len(positions))
        seq_lens.append(chunk.start + chunk.num_tokens)
        if chunk.start + chunk.num_tokens == request.num_tokens:
            samples.append(len(positions) - 1)
    width = 1
    while width < max(len(t) for t in tables):  # the longest table, to a power of two
        width *= 2
    return {
        "token_ids": tokens,
        "positions": positions,
        "cu_seqlens_q": cu,
        "seq_lens": seq_lens,
        "block_tables": [t + [0] * (width - len(t)) for t in tables],
        "sample_rows": samples,
        "pending_rows": pending,
        "kv_write_rows": rows,
    }


def test_a_mixed_step_packs_as_the_token_by_token_definition() -> None:
    plan, tables = _mixed_plan()
    batch = pack(plan, tables, BLOCK, HEAD_COUNTS)
    want = _oracle(plan, tables)
    for name in ("token_ids", "positions", "cu_seqlens_q", "seq_lens", "block_tables"):
        assert getattr(batch, name).tolist() == want[name], name
    assert batch.sample_rows.tolist() == want["sample_rows"] == [0, 1, 4]
    assert batch.pending_rows == want["pending_rows"] == [1]
    assert batch.pending_chunks == [1]
    assert {h: r.tolist() for h, r in batch.kv_write_rows.items()} == want["kv_write_rows"]
    assert batch.num_tokens == 9


@pytest.mark.parametrize("small", [True, False])
def test_a_decode_only_step_packs_one_row_per_request(small, monkeypatch) -> None:
    """From lists (a few sequences) or with numpy (many), the same arrays."""
    if not small:
        monkeypatch.setattr(packing, "SMALL_DECODE", 0)
    plan, tables = _mixed_plan()
    decodes = StepPlan(plan.chunks[:2])
    tables = [[7, 3, 1], [5, 9]]  # width 4
    batch = pack(decodes, tables, BLOCK, HEAD_COUNTS)
    want = _oracle(decodes, tables)
    for name in ("token_ids", "positions", "cu_seqlens_q", "seq_lens", "block_tables"):
        assert getattr(batch, name).tolist() == want[name], name
        assert getattr(batch, name).dtype == mx.int32, name
    assert batch.sample_rows.tolist() == want["sample_rows"] == [0, 1]
    assert batch.pending_rows == batch.pending_chunks == want["pending_rows"] == [1]
    assert {h: r.tolist() for h, r in batch.kv_write_rows.items()} == want["kv_write_rows"]
