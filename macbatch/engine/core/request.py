"""A request's life: waiting -> running (prefill in chunks, then decode) -> finished.

Text is detokenized incrementally (see ``text.py``: when read, except for requests with stop
strings); stop strings are matched on the text as tokens arrive, across token boundaries, and
text that might be the start of a stop string is held back until it is decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from macbatch.engine.core.outputs import FinishReason, Prefix, RequestMetrics, RequestOutput
from macbatch.engine.multimodal.prompt_images import PromptImages
from macbatch.engine.parsers.reasoning import Phase, ReasoningTracker
from macbatch.engine.parsers.text import ReplyText, TextView
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.structured_output.constraints import ConstraintState

LONG_ROPE_SCOPE = b"long-rope\0"  # beside an adapter's scope (``Request.rotate_long``)


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # requests are compared by identity
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int]
    detokenizer: Any
    metrics: RequestMetrics
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens with KV written (or dispatched to be written) in the paged cache.
    num_computed_tokens: int = 0
    # Tokens sampled on the device whose values the host has not read yet (0 or 1: the
    # pipelined step reads a step's tokens while the next one runs). They count in
    # ``num_tokens`` (the next step computes them) but not in ``output_token_ids``.
    num_pending: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    emitted_chars: int = 0  # of text shown so far (requests with stop strings)
    emitted_tokens: int = 0
    # One entry per output token, always (None when logprobs were not asked for).
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    capped_max_tokens: int | None = None
    reasoning: ReasoningTracker | None = None
    constraint: ConstraintState | None = None
    images: PromptImages | None = None  # where its images' rows are (vision models only)
    pooling: PoolingParams | None = None  # a pooling request: a vector out, never sampled
    # an encoder's token type of each prompt token (1: a pair's second text; engine/encoder/)
    token_types: list[int] | None = None
    # Speculative decoding: the tokens drafted to verify in the next step (engine/speculative).
    drafts: list[int] = field(default_factory=list)
    # Steps that failed with it among their requests and no culprit found (engine.py,
    # ``_contain``); ``step_failed``: it was finished because steps failed on it.
    failed_steps: int = 0
    step_failed: bool = False
    # Its adapter's slot in the adapted layers (0: the base model) and the prefix cache's scope
    # of its blocks (b"": the base model's), from ``ModelInfo.adapters`` (engine/lora/bank.py).
    adapter_slot: int = 0
    cache_scope: bytes = b""
    # A LongRoPE model's (engine/model/hooks/long_rope.py): every row rotated by the long
    # factors, from a prompt past the original positions or since the sequence reached them.
    long_rope: bool = False
    reply: ReplyText = field(init=False, repr=False)
    max_tokens: int = field(init=False)  # params.max_tokens, which the processor always sets

    def __post_init__(self) -> None:
        if self.params.max_tokens is None:
            raise ValueError("a request's max_tokens is fitted to the context before it is built")
        self.max_tokens = self.params.max_tokens
        self.reply = ReplyText(self.detokenizer, self.output_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
            if self.params.logprobs:
                self.top_logprobs = []

    def rotate_long(self) -> None:
        """From now on every row is rotated by the long factors (before any is computed so):
        its blocks get a prefix-cache scope of their own, never shared with a short one's."""
        self.long_rope = True
        self.cache_scope += LONG_ROPE_SCOPE

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def reads_cached_prefix(self) -> bool:
        """Whether it may start from cached prefix blocks: mean and first-token pooling need
        every row's hidden state, which cached blocks never had computed."""
        return self.pooling is None or self.pooling.pooling_method.reads_cached_prefix

    @property
    def needs_host_token(self) -> bool:
        """Whether sampling this request's next token needs its previous token on the host
        (penalties count the generated tokens there; a constraint's mask advances on it in
        ``append_token``). A reasoning tracker does not need it: it advances in
        ``append_token`` too, and only a constraint reads its phase before sampling. The
        pipelined step waits for the previous step's results before building the sampling graph
        when a request scheduled with a pending token says so. A thinking budget needs it
        while its reasoning may reach the budget (``ReasoningTracker.budget_due``)."""
        if self.params.penalized or self.constraint is not None:
            return True
        budget = self.params.thinking_token_budget
        return (
            budget is not None
            and self.reasoning is not None
            and self.reasoning.budget_due(self.num_generated, budget)
        )

    def forced_token(self) -> int | None:
        """The token a thinking budget makes this request's next one (None: sampled as usual):
        the reasoning's end marker at the budget, then the answer's header where the format has
        one and no constraint forces its own."""
        budget = self.params.thinking_token_budget
        if budget is None or self.reasoning is None or self.finished:
            return None
        return self.reasoning.budget_token(self.num_generated, budget, self.constraint is None)

    def token_slice(self, start: int, stop: int) -> list[int]:
        """Tokens ``start:stop`` of prompt + output without copying the whole sequence (a
        decode step needs one token of a possibly long one)."""
        split = len(self.prompt_token_ids)
        if start >= split:
            return self.output_token_ids[start - split : stop - split]
        if stop <= split:
            return self.prompt_token_ids[start:stop]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - split]

    def hash_slice(self, start: int, stop: int) -> list[int]:
        """``token_slice`` as the prefix cache hashes it: image rows keyed by their images."""
        tokens = self.token_slice(start, stop)
        return tokens if self.images is None else self.images.hash_tokens(tokens, start)

    def chunk_tokens(self, count: int) -> int:
        """The most of ``count`` tokens from ``num_computed_tokens`` the next prefill chunk may
        take (an image block that attends both ways is never split: ``PromptImages``)."""
        if self.images is None:
            return count
        return self.images.chunk_tokens(self.num_computed_tokens, count)

    def can_resume_at(self, position: int) -> bool:
        """Whether a cached prefix may end at ``position``."""
        return self.images is None or self.images.can_resume_at(position)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Prompt and output tokens whose values the host has."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Every token of the sequence so far, pending ones included."""
        return self.num_known_tokens + self.num_pending

    @property
    def num_generated(self) -> int:
        """Tokens sampled so far (pending ones included): what seeds and max_tokens count."""
        return len(self.output_token_ids) + self.num_pending

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens whose KV the next steps must compute. A pending token that will end the
        request by length needs none: nothing is sampled after it."""
        end = self.num_tokens
        if self.num_pending and self.num_generated >= self.max_tokens:
            end -= self.num_pending
        return max(0, end - self.num_computed_tokens)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(
        self,
        token: int,
        now: float,
        logprob: float | None = None,
        top: dict[int, float] | None = None,
    ) -> bool:
        """Record a sampled token with its logprob and top alternatives (when asked for); finish
        on EOS, a stop token or string, or the length limit. A stop token is not recorded, and
        neither are its logprobs: the lists stay the same length. Returns whether the token was
        recorded."""
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        params = self.params
        if token in params.stop_token_ids or (
            token in self.eos_token_ids and not params.ignore_eos
        ):
            self.finish(FinishReason.STOP, now)
            return False
        self.output_token_ids.append(token)
        if self.logprobs is not None:
            self.logprobs.append(_required(logprob, "logprob"))
        if self.top_logprobs is not None:
            self.top_logprobs.append(_required(top, "top logprobs"))
        self.metrics.generated_tokens += 1
        before = self.reasoning.phase if self.reasoning else Phase.ANSWER
        if self.reasoning:
            self.reasoning.advance(self.output_token_ids)
        index = len(self.output_token_ids) - 1
        if self.constraint and (error := self.constraint.accept(token, before, index)):
            self.finish(FinishReason.ERROR, now, error)
        elif params.stop and self._cut_at_stop_string():
            self.finish(FinishReason.STOP, now)
        elif len(self.output_token_ids) >= self.max_tokens:
            self.finish(FinishReason.LENGTH, now)
        return True

    def _cut_at_stop_string(self) -> bool:
        text = self.reply.current()
        longest = max(len(s) for s in self.params.stop)
        window_start = max(0, self.emitted_chars - longest)
        hits = [i for s in self.params.stop if (i := text.find(s, window_start)) >= 0]
        if not hits:
            return False
        self.reply.cut(min(hits))
        return True

    def finish(self, reason: FinishReason, now: float, error: str | None = None) -> None:
        if self.finished:
            return
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.metrics.finished_time = now

    def _visible_end(self, text: str) -> int:
        """How much of the text may be shown: all of it once finished, else up to any suffix
        that could still grow into a stop string."""
        if self.finished:
            return len(text)
        for held in range(min(len(text), max(len(s) for s in self.params.stop) - 1), 0, -1):
            tail = text[-held:]
            if any(s.startswith(tail) for s in self.params.stop):
                return len(text) - held
        return len(text)

    def make_output(self, step: int) -> RequestOutput:
        """The output for this step: everything so far plus the delta since the last output.
        Text is left to be detokenized (and a reasoning model's split into reasoning and
        answer, as the tracker stands now) when read, unless stop strings needed it already."""
        tokens = self.output_token_ids
        count = len(tokens)
        finished = self.status is RequestStatus.FINISHED
        end = None
        if self.params.stop:
            end = max(self._visible_end(self.reply.current(finished)), self.emitted_chars)
            self.emitted_chars = end
        new_tokens = tokens[self.emitted_tokens :]
        self.emitted_tokens = count
        split = self.reasoning.snapshot().split if self.reasoning else None
        logprobs, top = self.logprobs, self.top_logprobs
        output = RequestOutput(
            request_id=self.request_id,
            token_ids=Prefix(tokens, count),
            new_token_ids=new_tokens,
            finished=finished,
            finish_reason=self.finish_reason,
            metrics=self.metrics,
            step=step,
            error=self.error,
            logprobs=Prefix(logprobs, count) if logprobs is not None else None,
            top_logprobs=Prefix(top, count) if top is not None else None,
            capped_max_tokens=self.capped_max_tokens,
            text_view=TextView(self.reply, self.reply.mark(count, finished, end, split)),
        )
        output.step_failed = self.step_failed
        return output


def _required(value: Any, what: str) -> Any:
    if value is None:
        raise ValueError(f"the request asked for logprobs but a token came without its {what}")
    return value
