"""What a request reports after each step (``RequestOutput``), why it finished, its metrics and
speculation counts: the types that cross to the front ends, kept apart from the ``Request`` the
engine core mutates."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from macbatch.engine.parsers.text import NO_TEXT, FixedText, TextView


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a reply in the context (or the KV pool); nothing queued.
    ``what`` says so without advice, for front ends that give their own (chat: a new chat)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; shorten the prompt")
        self.what = what


@dataclass
class SpeculationCounts:
    """Speculative decoding's totals (a request's, or the engine's): tokens drafted, of them
    accepted, and verifications (steps in which drafts were verified)."""

    drafted: int = 0
    accepted: int = 0
    verifications: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts of all drafted (0 without speculation)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verification emits on average: its accepted drafts and the target's own."""
        if not self.verifications:
            return 0.0
        return (self.accepted + self.verifications) / self.verifications

    def add(self, drafted: int, accepted: int, verifications: int = 1) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verifications += verifications


# The buckets of a request's acceptance and accepted length (/metrics' histograms; the job
# summary gives their quantiles): the one reading of a request's numbers is SpeculationCounts'.
ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ACCEPTED_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 17.0)


def per_request_speculation(counts: SpeculationCounts) -> tuple[float, float] | None:
    """A finished request's acceptance rate and mean accepted length, or None when it verified
    no drafts (a request that never speculated says nothing of how drafts fare)."""
    if not counts.verifications:
        return None
    return counts.acceptance_rate, counts.mean_accepted_length


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    disk_cached_tokens: int = 0  # of cached_tokens, those read back from the disk tier
    preemptions: int = 0
    speculation: SpeculationCounts = field(default_factory=lambda: SpeculationCounts())

    @property
    def queue_time_s(self) -> float | None:
        return self._since_arrival(self.first_scheduled_time)

    @property
    def time_to_first_token_s(self) -> float | None:
        return self._since_arrival(self.first_token_time)

    @property
    def total_time_s(self) -> float | None:
        return self._since_arrival(self.finished_time)

    def _since_arrival(self, moment: float | None) -> float | None:
        return None if moment is None else moment - self.arrival_time

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Generated tokens after the first, over the time since the first."""
        end = self.finished_time or time.monotonic()
        if self.first_token_time is None or self.generated_tokens < 2:
            return None
        elapsed = end - self.first_token_time
        return (self.generated_tokens - 1) / elapsed if elapsed > 0 else None


class Prefix(NamedTuple):
    """The first ``length`` items of a list that only grows (a request's output tokens, logprobs
    or top logprobs): what an output shows of it, copied when first read."""

    items: list[Any]
    length: int

    def listed(self) -> list[Any]:
        return self.items[: self.length]


class RequestOutput:
    """A request's state after a step. The engine makes one per advancing request per step, so
    what would cost O(reply length) is left for whoever reads it: ``token_ids``, ``logprobs``
    and ``top_logprobs`` are copied from the request's lists when first read (constructed from
    a list, they are that list), and ``text`` is detokenized when first read (text.py)."""

    __slots__ = (
        "request_id", "_token_ids", "new_token_ids", "finished", "finish_reason", "metrics",
        "step", "error", "_logprobs", "_top_logprobs", "capped_max_tokens", "text_view",
        "embedding", "score", "lexical_weights", "colbert_vectors", "step_failed",
    )  # fmt: skip

    def __init__(
        self,
        request_id: str,
        token_ids: list[int] | Prefix,
        new_token_ids: list[int],
        finished: bool,
        finish_reason: FinishReason | None,
        metrics: RequestMetrics,
        step: int,
        error: str | None = None,
        logprobs: list[float] | Prefix | None = None,
        top_logprobs: list[dict[int, float]] | Prefix | None = None,
        capped_max_tokens: int | None = None,
        text_view: TextView | FixedText = NO_TEXT,
    ) -> None:
        self.request_id = request_id
        self._token_ids = token_ids
        self.new_token_ids = new_token_ids
        self.finished = finished
        self.finish_reason = finish_reason
        self.metrics = metrics
        self.step = step
        self.error = error
        self._logprobs = logprobs
        self._top_logprobs = top_logprobs
        # The max_tokens the request ran with when the room its prompt left in the context was
        # smaller than the one asked for (None: not capped). See Engine.context_limit.
        self.capped_max_tokens = capped_max_tokens
        self.text_view = text_view  # the reply's text as of this output
        # A pooling request's result (engine/pooling/methods.py): its vector, float32 [D], or a
        # cross-encoder's relevance score; None for generation requests.
        self.embedding: Any = None
        self.score: float | None = None
        # BGE-M3's other outputs, when asked for (PoolingParams.lexical / colbert): token id ->
        # weight, and float32 [tokens - 1, D]
        self.lexical_weights: dict[int, float] | None = None
        self.colbert_vectors: Any = None
        # An ERROR finish because a step failed on this request (the engine's fault: a 500);
        # without it, ``error`` is why its input cannot run (a 400).
        self.step_failed = False

    def __repr__(self) -> str:
        return (
            f"RequestOutput({self.request_id!r}, {len(self.token_ids)} tokens, "
            f"finished={self.finished}, finish_reason={self.finish_reason}, step={self.step})"
        )

    @property
    def token_ids(self) -> list[int]:
        """Every token generated so far."""
        if isinstance(self._token_ids, Prefix):
            self._token_ids = self._token_ids.listed()
        return self._token_ids

    @property
    def logprobs(self) -> list[float] | None:
        """One per token of ``token_ids`` (None: not asked for)."""
        if isinstance(self._logprobs, Prefix):
            self._logprobs = self._logprobs.listed()
        return self._logprobs

    @property
    def top_logprobs(self) -> list[dict[int, float]] | None:
        """The top alternatives, one dict per token of ``token_ids`` (None: not asked for)."""
        if isinstance(self._top_logprobs, Prefix):
            self._top_logprobs = self._top_logprobs.listed()
        return self._top_logprobs

    @property
    def text(self) -> str:
        """The reply so far (all of it once finished; a stop string and what follows are cut).
        A reasoning model's reply: the answer, without its reasoning block."""
        return self.text_view.text

    @property
    def new_text(self) -> str:
        """The text this output adds to the previous one's."""
        return self.text_view.new_text

    @property
    def reasoning(self) -> str | None:
        """The reasoning block's text (None: the reply had none)."""
        return self.text_view.reasoning

    @property
    def new_reasoning(self) -> str:
        """The reasoning this output adds to the previous one's."""
        return self.text_view.new_reasoning
