"""Sampling parameters, validated when built: what a request asks the sampler for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from macbatch.engine.structured_output.constraints import StructuredOutput

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
