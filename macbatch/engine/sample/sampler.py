"""The batched sampler: one step's logits into a token for every sampled row at once, forced
tokens (a thinking budget's end) included.

Every request carries its own seed, and the random noise of a row depends only on that seed and
the number of tokens the request has generated, so a seeded request gives the same output whatever
else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import mlx.core as mx
import numpy as np

from macbatch.engine.sample.params import SamplingParams


class SampleRow(Protocol):
    """What the sampler reads of one sampled row (a ``Request`` is one: no per-step copy). The
    token lists are read only by penalties."""

    @property
    def params(self) -> SamplingParams: ...

    @property
    def seed(self) -> int: ...

    @property
    def num_generated(self) -> int: ...

    @property
    def all_token_ids(self) -> list[int]: ...  # prompt and output: repetition penalty

    @property
    def output_token_ids(self) -> list[int]: ...  # presence and frequency penalties

    def forced_token(self) -> int | None: ...  # the only token this row may take (None: any)


@dataclass
class SampledBatch:
    tokens: mx.array
    logprobs: mx.array | None = None
    top_ids: mx.array | None = None
    top_logprobs: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        parts = (self.tokens, self.logprobs, self.top_ids, self.top_logprobs)
        return [a for a in parts if a is not None]

    def to_host(self) -> HostSamples:
        """The sampled values as Python lists (waits for the device to compute them)."""

        # MLX's stub types ``tolist`` as any nesting of scalars; these arrays are 1-d or 2-d.
        def listed(a: mx.array | None) -> list[Any] | None:
            return cast(list[Any], a.tolist()) if a is not None else None

        return HostSamples(
            cast(list[int], self.tokens.tolist()),
            listed(self.logprobs),
            listed(self.top_ids),
            listed(self.top_logprobs),
        )


@dataclass
class HostSamples:
    tokens: list[int]
    logprobs: list[float] | None
    top_ids: list[list[int]] | None
    top_logprobs: list[list[float]] | None

    def row(self, i: int, want: int | None) -> tuple[int, float | None, dict[int, float] | None]:
        """Row ``i``'s token, its logprob and its top ``want`` alternatives, as a request with
        ``logprobs=want`` asked for them (None where not asked)."""
        if want is None or self.logprobs is None:
            return self.tokens[i], None, None
        top = None
        if want and self.top_ids is not None and self.top_logprobs is not None:
            top = dict(zip(self.top_ids[i][:want], self.top_logprobs[i][:want]))
        return self.tokens[i], self.logprobs[i], top


def sample(logits: mx.array, rows: Sequence[SampleRow]) -> SampledBatch:
    """One token per row of ``logits [R, V]`` (float32); builds the graph, evaluates nothing."""
    logits = _force_tokens(logits, [r.forced_token() for r in rows])
    if any(r.params.penalized for r in rows):
        logits = _apply_penalties(logits, rows)
    tokens = mx.argmax(logits, axis=-1)
    stochastic = [i for i, r in enumerate(rows) if not r.params.greedy]
    if stochastic:
        tokens = _sample_stochastic(logits, rows, tokens)
    batch = SampledBatch(tokens=tokens)
    want = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    if want:
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        batch.logprobs = mx.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
        k = max(want)
        if k:
            top = mx.argsort(-logp, axis=-1)[:, :k]
            batch.top_ids = top
            batch.top_logprobs = mx.take_along_axis(logp, top, axis=-1)
    return batch


def _force_tokens(logits: mx.array, forced: Sequence[int | None]) -> mx.array:
    """``logits`` where row i allows only ``forced[i]`` (None: the row as it is): forcing is a
    mask rather than a substitution, so every sampling mode picks the token, with logprob 0."""
    rows = [(i, token) for i, token in enumerate(forced) if token is not None]
    if not rows:
        return logits
    allowed = np.ones(logits.shape, dtype=np.bool_)
    for i, token in rows:
        allowed[i] = False
        allowed[i, token] = True
    return mx.where(mx.array(allowed), logits, -mx.inf)


def _apply_penalties(logits: mx.array, rows: Sequence[SampleRow]) -> mx.array:
    rep_rows, rep_ids, rep_vals = [], [], []
    pf_rows, pf_ids, pf_sub = [], [], []
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1 and (all_ids := row.all_token_ids):
            seen = np.unique(np.asarray(all_ids))
            rep_rows.append(np.full(len(seen), i))
            rep_ids.append(seen)
            rep_vals.append(np.full(len(seen), p.repetition_penalty, dtype=np.float32))
        if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
            ids, counts = np.unique(np.asarray(row.output_token_ids), return_counts=True)
            pf_rows.append(np.full(len(ids), i))
            pf_ids.append(ids)
            pf_sub.append((p.presence_penalty + p.frequency_penalty * counts).astype(np.float32))
    if rep_rows:
        r, t = mx.array(np.concatenate(rep_rows)), mx.array(np.concatenate(rep_ids))
        penalty = mx.array(np.concatenate(rep_vals))
        picked = logits[r, t]
        logits[r, t] = mx.where(picked > 0, picked / penalty, picked * penalty)
    if pf_rows:
        r, t = mx.array(np.concatenate(pf_rows)), mx.array(np.concatenate(pf_ids))
        logits[r, t] = logits[r, t] - mx.array(np.concatenate(pf_sub))
    return logits


def _sample_stochastic(logits: mx.array, rows: Sequence[SampleRow], greedy: mx.array) -> mx.array:
    """Gumbel-max sampling after temperature and top-k / top-p / min-p filtering.

    The noise of each row comes from its own key, so rows never influence each other.
    """
    vocab = logits.shape[-1]
    temps = np.array([r.params.temperature or 1.0 for r in rows], dtype=np.float32)
    scaled = logits / mx.array(temps)[:, None]
    noise = mx.stack(
        [mx.random.gumbel(shape=(vocab,), key=mx.random.key(_row_key(r))) for r in rows]
    )
    if any(r.params.filters for r in rows):
        order = mx.argsort(-scaled, axis=-1)
        ranked = mx.take_along_axis(scaled, order, axis=-1)
        probs = mx.softmax(ranked, axis=-1)
        # past the vocabulary top_k keeps every token: clamped, it always fits int32
        top_k = np.array([min(r.params.top_k or vocab, vocab) for r in rows], dtype=np.int32)
        top_p = np.array([r.params.top_p for r in rows], dtype=np.float32)
        min_p = np.array([r.params.min_p for r in rows], dtype=np.float32)
        keep = mx.arange(vocab)[None, :] < mx.array(top_k)[:, None]
        # top_p 1 keeps every token (the cumulative sum may round past 1 before the tail)
        nucleus = (mx.cumsum(probs, axis=-1) - probs) < mx.array(top_p)[:, None]
        keep = keep & (nucleus | mx.array(top_p >= 1)[:, None])
        keep = keep & (probs >= mx.array(min_p)[:, None] * probs[:, :1])
        ranked = mx.where(keep, ranked, -mx.inf)
        # each token keeps its own noise, so a row without filters samples as it would in a
        # batch without any (the seed promise above)
        choice = mx.argmax(ranked + mx.take_along_axis(noise, order, axis=-1), axis=-1)
        sampled = mx.take_along_axis(order, choice[:, None], axis=-1)[:, 0]
    else:
        sampled = mx.argmax(scaled + noise, axis=-1)
    is_greedy = mx.array(np.array([r.params.greedy for r in rows]))
    return mx.where(is_greedy, greedy, sampled)


def _row_key(row: SampleRow) -> int:
    return (row.seed * 1_000_003 + row.num_generated) % (2**63)
