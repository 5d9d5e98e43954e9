"""Sampling parameters, validated when built: what a request asks the sampler for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from macbatch.engine.structured_output.constraints import StructuredOutput

MAX_TEMPERATURE = 2.0  # OpenAI's limit too; clients and users know it
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
# Integer fields' ceiling (token counts, top_k, token ids): what the sampler's int32 arrays and
# MLX's token ids hold, and far past any context. A value past it once reached MLX and raised
# inside the engine's step, which took the engine down for everyone.
MAX_INT = 2**31 - 1
SEED_RANGE = (-(2**63), 2**63 - 1)  # a signed 64-bit integer, as OpenAI's and vLLM's seeds
# Dividing logits by a penalty outside this range overflows float32 to inf (and inf * 0 is NaN).
REPETITION_PENALTY_RANGE = (0.01, 100.0)


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
    Every field is bounded (integers at ``MAX_INT``, a seed at 64 bits), so whatever a request
    carries fits the arrays the sampler hands MLX: a bad value is this request's error, here.
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
            self.max_tokens is None or _int_in(self.max_tokens, 1, MAX_INT),
            "max_tokens",
            self.max_tokens,
            f"an integer in [1, {MAX_INT}], or None for as many as the context allows",
        )
        _check(
            _finite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE,
            "temperature",
            self.temperature,
            f"a number in [0, {MAX_TEMPERATURE:g}] (0 means greedy)",
        )
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(
            _int_in(self.top_k, 0, MAX_INT),
            "top_k",
            self.top_k,
            f"an integer in [0, {MAX_INT}] (0 means off)",
        )
        _check(_finite(self.min_p) and 0 <= self.min_p < 1, "min_p", self.min_p, "in [0, 1)")
        low, high = REPETITION_PENALTY_RANGE
        _check(
            _finite(self.repetition_penalty) and low <= self.repetition_penalty <= high,
            "repetition_penalty",
            self.repetition_penalty,
            f"in [{low:g}, {high:g}] (1 means off)",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2 <= value <= 2, name, value, "in [-2, 2]")
        _check(
            self.seed is None or _int_in(self.seed, *SEED_RANGE),
            "seed",
            self.seed,
            f"None or an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (64-bit)",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings"
        )
        _check(
            all(_int_in(t, 0, MAX_INT) for t in self.stop_token_ids),
            "stop_token_ids",
            self.stop_token_ids,
            f"integers in [0, {MAX_INT}]",
        )
        _check(
            self.logprobs is None or _int_in(self.logprobs, 0, MAX_LOGPROBS),
            "logprobs",
            self.logprobs,
            f"None or an integer in [0, {MAX_LOGPROBS}]",
        )
        _check(
            self.thinking_token_budget is None or _int_in(self.thinking_token_budget, 0, MAX_INT),
            "thinking_token_budget",
            self.thinking_token_budget,
            f"None or an integer in [0, {MAX_INT}]",
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


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


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
