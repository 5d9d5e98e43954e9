"""Speculating decodes' verification chunks through a hybrid's recurrent layer as one batch
(``model/recurrent.py``), for every recurrent family (Gated DeltaNet, Mamba 2, LFM2's short
convolution; a decoder layer, or Falcon-H1's mixer beside the attention): every sequence's
output rows, final state (its slot) and state after its first token (its snapshot) equal
mlx-lm's own layer run on that sequence alone, from the same state, to float32 rounding; and the
layer is called once per batch, not once per sequence, with the snapshot taken inside that call
(``model/state_cut.py``): not once per part, which would read the layer's weights twice."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import ArraysCache

from macbatch.engine.model.adapter import ModelAdapter
from macbatch.engine.model.recurrent import PagedStateCache, StateChunk, StateRows
from macbatch.engine.stores.state_store import StateShape, StateStore
from tests.support.tiny import HYBRID_CONFIGS, build_model

ROWS = 12


def _alone(layer, arrays: int, x: np.ndarray, state: list[mx.array] | None, cut: int):
    """mlx-lm's layer (``arrays`` state arrays) over one sequence from ``state`` (None: its own
    zeros); returns its output rows, its state after ``cut`` tokens and its final state."""
    cache = ArraysCache(arrays)
    for e, array in enumerate(state or []):
        cache[e] = array
    first = layer(mx.array(x[None, :cut]), cache=cache)
    after_cut = [mx.array(a) for a in cache.cache]
    rest = layer(mx.array(x[None, cut:]), cache=cache) if cut < len(x) else first[:, :0]
    return np.array(mx.concatenate([first, rest], axis=1)[0]), after_cut, list(cache.cache)


def _first_recurrent(arch: str):
    """The first module of ``arch``'s tiny model handed a recurrent state (the hooks installed,
    as the engine loads it), its state arrays and the model's hidden size."""
    model = build_model(arch)
    adapter = ModelAdapter(model)
    index = next(i for i, entry in enumerate(adapter.recurrent) if any(entry))
    mixer = adapter.family.side_by_side_mixer
    layer = getattr(adapter.layers[index], mixer) if mixer else adapter.layers[index]
    embed = next(
        v
        for k, v in tree_flatten(model.parameters())
        if k.endswith("embed_tokens.weight") or k.endswith("embeddings.weight")
    )
    return layer, adapter.recurrent[index][0], embed.shape[1]


@pytest.mark.parametrize("arch", sorted(HYBRID_CONFIGS))
def test_a_batch_of_verification_chunks_is_each_run_alone(arch, monkeypatch):
    layer, arrays, hidden = _first_recurrent(arch)
    rng = np.random.default_rng(3)

    # Realistic states in every row: mlx-lm's layer after a few random tokens.
    rows: list[list[mx.array]] = []
    for _ in range(ROWS):
        _, _, state = _alone(layer, arrays, rng.standard_normal((5, hidden), np.float32), None, 5)
        rows.append(state)
    shapes = StateShape(tuple(a.shape[1:] for a in rows[0]), tuple(a.dtype for a in rows[0]))
    store = StateStore([shapes], rows=ROWS, snapshots=True)
    store.states[0] = [mx.concatenate([r[e] for r in rows]) for e in range(arrays)]

    # Four speculating requests (slots 0, 2, 6, 8; snapshots next to them), three with three
    # drafts and one with one, among two plain decodes; scattered over the step's rows.
    lengths = [4, 1, 4, 2, 1, 4]
    plans = [
        StateChunk(6, 6, checkpoint=7, checkpoint_at=1),
        StateChunk(4, 4),
        StateChunk(0, 0, checkpoint=1, checkpoint_at=1),
        StateChunk(8, 8, checkpoint=9, checkpoint_at=1),
        StateChunk(10, 10),
        StateChunk(3, 2, checkpoint=3, checkpoint_at=1),  # resumes from its snapshot
    ]
    x = rng.standard_normal((sum(lengths), hidden)).astype(np.float32)
    step_rows = StateRows.build(np.array(lengths), plans)
    assert [len(b.chunks) for b in step_rows.batches] == [3, 1]

    base = type(layer).__mro__[1]
    seen: list[tuple[int, ...]] = []
    original = base.__call__

    def spy(self, h, *args, **kwargs):
        seen.append(h.shape[:2])
        return original(self, h, *args, **kwargs)

    monkeypatch.setattr(base, "__call__", spy)
    out = layer(mx.array(x)[:, None], cache=PagedStateCache(store, 0, step_rows))
    out = np.array(out)[:, 0]
    store.settle()
    monkeypatch.setattr(base, "__call__", original)
    assert seen == [(2, 1), (3, 4), (1, 2)]  # singles, the 4s, the 2

    written: dict[int, list[mx.array]] = {}
    first = 0
    for length, plan in zip(lengths, plans):
        cut = plan.checkpoint_at if plan.checkpoint >= 0 else length
        want, after_cut, final = _alone(
            layer, arrays, x[first : first + length], rows[plan.read], cut
        )
        np.testing.assert_allclose(out[first : first + length], want, rtol=1e-5, atol=1e-5)
        written[plan.write] = final
        if plan.checkpoint >= 0:
            written[plan.checkpoint] = after_cut
        first += length
    for row in range(ROWS):
        for e in range(arrays):
            want_state = written.get(row, rows[row])[e]
            got = store.states[0][e][row]
            np.testing.assert_allclose(np.array(got), np.array(want_state[0]), rtol=1e-5, atol=1e-5)
