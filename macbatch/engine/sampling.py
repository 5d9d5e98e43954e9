"""Sampling parameters (validated) and the batched sampler that turns one step's logits into
tokens for every sampled row at once.

Every request carries its own seed, and the random noise of a row depends only on that seed and
the number of tokens the request has generated, so a seeded request gives the same output whatever
else shares its batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import mlx.core as mx
import numpy as np

from macbatch.engine.constraints import StructuredOutput

MAX_TEMPERATURE = 2.0  # OpenAI's limit too; clients and users know it


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops.

    ``max_tokens`` is a cap: the engine shrinks it to the room the prompt leaves in the model's
    context (and the KV pool), and ``None`` asks for all of that room, as OpenAI's chat API does.
    ``temperature=0`` is greedy; above 2 every model's output is noise, so it is refused.
    ``top_k=0``, ``top_p=1``, ``min_p=0`` and penalties of 1/0/0 are off.
    ``repetition_penalty`` divides positive logits of every token seen in the prompt or the
    output (as Hugging Face does); ``presence_penalty`` and ``frequency_penalty`` subtract per
    generated occurrence (as OpenAI does). ``logprobs=None`` returns none, ``0`` the chosen
    token's, ``k`` also the top k. ``structured`` constrains the answer (JSON schema, regex,
    choice, grammar); its logprobs are those of the constrained distribution.
    ``thinking_token_budget``: the most tokens a reasoning model's reasoning block may hold; at
    the budget the engine writes the template's end marker (Qwen3's ``</think>``) and the answer
    follows (None: no budget; 0 closes the block at once). A reply without reasoning ignores it.
    ``speculative=False`` opts the request out of an engine's speculative decoding (its output
    is the same either way: docs/speculative.md).
    """

    max_tokens: int | None = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    structured: StructuredOutput | None = None
    thinking_token_budget: int | None = None
    speculative: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            "max_tokens",
            self.max_tokens,
            "an integer >= 1, or None for as many as the context allows",
        )
        _check(
            _finite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE,
            "temperature",
            self.temperature,
            f"a number in [0, {MAX_TEMPERATURE:g}] (0 means greedy)",
        )
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            "top_k",
            self.top_k,
            "an integer >= 0 (0 means off)",
        )
        _check(_finite(self.min_p) and 0 <= self.min_p < 1, "min_p", self.min_p, "in [0, 1)")
        _check(
            _finite(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            self.repetition_penalty,
            "a finite number > 0",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2 <= value <= 2, name, value, "in [-2, 2]")
        _check(
            self.seed is None or isinstance(self.seed, int), "seed", self.seed, "an integer or None"
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings"
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            self.stop_token_ids,
            "non-negative integers",
        )
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
            "logprobs",
            self.logprobs,
            "None or an integer in [0, 20]",
        )
        _check(
            self.thinking_token_budget is None
            or (isinstance(self.thinking_token_budget, int) and self.thinking_token_budget >= 0),
            "thinking_token_budget",
            self.thinking_token_budget,
            "None or an integer >= 0",
        )
        _check(isinstance(self.speculative, bool), "speculative", self.speculative, "true or false")
        _check(
            self.structured is None or isinstance(self.structured, StructuredOutput),
            "structured",
            self.structured,
            "None or a StructuredOutput",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    @property
    def penalized(self) -> bool:
        return (
            self.repetition_penalty != 1
            or self.presence_penalty != 0
            or self.frequency_penalty != 0
        )


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class InvalidSamplingParam(ValueError):
    """A sampling parameter out of range; ``field`` names it (servers report it as ``param``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise InvalidSamplingParam(
            name, f"invalid sampling parameter {name}={value!r}: must be {expected}"
        )


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
        top_k = np.array([r.params.top_k or vocab for r in rows])
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
