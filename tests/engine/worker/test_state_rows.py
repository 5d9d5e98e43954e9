"""A step's recurrent-state reads and writes (``PagedStateCache``): every sequence starts from its
read slot (zeros for -1), leaves its final state in its write slot and its checkpoint in its
checkpoint slot, and no other slot changes; against a numpy loop over the same recurrence. The
slots are scrambled so the one-token rows' reads and writes form several stretches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine.model import recurrent
from macbatch.engine.model.recurrent import PagedStateCache, StateChunk, StateRows, stretches
from macbatch.engine.stores.state_store import StateShape, StateStore

WIDTH = 3


def _toy_layer(x: mx.array, cache) -> mx.array:
    """A recurrence with one state array: ``s = s / 2 + x_t``, output ``s`` after each token."""
    state = cache[0] if cache[0] is not None else mx.zeros((x.shape[0], WIDTH))
    outs = []
    for t in range(x.shape[1]):
        state = state * 0.5 + x[:, t]
        outs.append(state)
    cache[0] = state
    return mx.stack(outs, axis=1)


def _numpy_step(store: np.ndarray, x: np.ndarray, lengths, plans) -> np.ndarray:
    """The oracle: each chunk in row order from its read slot; returns the output rows."""
    outs, row = [], 0
    for length, plan in zip(lengths, plans):
        state = store[plan.read].copy() if plan.read >= 0 else np.zeros(WIDTH, np.float32)
        for t in range(length):
            state = state * 0.5 + x[row]
            outs.append(state)
            row += 1
            if plan.checkpoint >= 0 and t + 1 == plan.checkpoint_at:
                store[plan.checkpoint] = state
        store[plan.write] = state
    return np.stack(outs)


def _assert_step_is_numpys(
    lengths: list[int], plans: list[StateChunk], num_rows: int, seed: int
) -> tuple[StateRows, list[tuple[int, ...]]]:
    """One step over a store of ``num_rows`` random rows: its outputs and the store after it
    equal the numpy oracle's; returns the step's rows and the (batch, length) of each call."""
    store = StateStore([StateShape(((WIDTH,),), (mx.float32,))], rows=num_rows)
    rng = np.random.default_rng(seed)
    before = rng.standard_normal((num_rows, WIDTH)).astype(np.float32)
    store.states[0][0] = mx.array(before)
    x = rng.standard_normal((sum(lengths), WIDTH)).astype(np.float32)
    rows = StateRows.build(np.array(lengths), plans)
    seen: list[tuple[int, ...]] = []

    def layer(h: mx.array, cache) -> mx.array:
        seen.append(h.shape[:2])
        return _toy_layer(h, cache)

    out = PagedStateCache(store, 0, rows).run(layer, mx.array(x)[:, None], (), {})
    want_store = before.copy()
    want = _numpy_step(want_store, x, lengths, plans)
    np.testing.assert_allclose(np.array(out)[:, 0], want, rtol=1e-6)
    store.settle()  # the slots point at the step's outputs until copied into the store's rows
    np.testing.assert_allclose(np.array(store.states[0][0]), want_store, rtol=1e-6)
    return rows, seen


@pytest.mark.parametrize("group_rows", [None, 1, 2])
def test_scrambled_slots_read_and_write_only_their_own(
    group_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the one-token rows cut into groups of 1 or 2 (``GROUP_BYTES``): the groups'
    stretches of reads, writes and checkpoints cross group boundaries."""
    if group_rows is not None:
        monkeypatch.setattr(recurrent, "GROUP_BYTES", group_rows * WIDTH * 4)
    lengths = [1, 1, 3, 1, 1, 2, 1]
    plans = [
        StateChunk(4, 4),
        StateChunk(5, 5, checkpoint=7, checkpoint_at=1),  # a decode row on a block boundary
        StateChunk(-1, 0, checkpoint=6, checkpoint_at=2),  # a prompt cut at a boundary
        StateChunk(2, 2),
        StateChunk(-1, 1),  # a one-token prompt: zeros
        StateChunk(3, 3),
        StateChunk(8, 9),  # resumes from a checkpoint slot, then its own slot
    ]
    rows, _ = _assert_step_is_numpys(lengths, plans, num_rows=12, seed=0)
    assert len(rows.single_reads) == 4  # 4,5 | 2 | zeros | 8: stretches, not one per row


@pytest.mark.parametrize("group_rows", [None, 2])
def test_verification_chunks_run_as_one_batch_per_length(
    group_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Speculating decodes' chunks (the last token and its drafts, a checkpoint into the slot's
    snapshot after the first) of one length run together, wherever their rows are in the step
    and whatever their slots (also cut into groups of two: ``GROUP_BYTES``); a prompt chunk of
    the same length but another cut, and one at or over ``BATCHED_BELOW``, run apart. Each
    sequence still reads and writes only its own slots."""
    if group_rows is not None:
        monkeypatch.setattr(recurrent, "GROUP_BYTES", group_rows * WIDTH * 4)
    monkeypatch.setattr(recurrent, "BATCHED_BELOW", 6)
    lengths = [4, 1, 4, 3, 3, 3, 4, 1, 4, 6]
    plans = [
        StateChunk(6, 6, checkpoint=7, checkpoint_at=1),
        StateChunk(0, 0),
        StateChunk(2, 2, checkpoint=3, checkpoint_at=1),
        StateChunk(10, 10, checkpoint=11, checkpoint_at=1),  # three in a row: one slice
        StateChunk(12, 12, checkpoint=13, checkpoint_at=1),
        StateChunk(17, 16, checkpoint=17, checkpoint_at=1),  # resumes from its snapshot
        StateChunk(-1, 4),  # a prompt of the same length: no checkpoint, so its own batch
        StateChunk(5, 5),
        StateChunk(8, 8, checkpoint=9, checkpoint_at=1),
        StateChunk(-1, 14, checkpoint=15, checkpoint_at=2),  # long: alone
    ]
    rows, seen = _assert_step_is_numpys(lengths, plans, num_rows=18, seed=1)
    assert [len(b.chunks) for b in rows.batches] == [3, 3, 1, 1]  # 4s | 3s | the prompt | 6
    assert rows.batches[1].rows is None  # consecutive rows: sliced, not gathered
    if group_rows is None:  # the singles; each batch's first token, then the rest
        assert seen == [(2, 1), (3, 1), (3, 3), (3, 1), (3, 2), (1, 4), (1, 2), (1, 4)]


def test_stretches_cover_the_slots_in_order() -> None:
    slots = [3, 4, 5, -1, -1, 7, 6, 0, 1, -1, 2]
    found = stretches(slots)
    assert found == ((0, 3, 3), (3, -1, 2), (5, 7, 1), (6, 6, 1), (7, 0, 2), (9, -1, 1), (10, 2, 1))
    rebuilt = [slot + i if slot >= 0 else -1 for _, slot, n in found for i in range(n)]
    assert rebuilt == slots
