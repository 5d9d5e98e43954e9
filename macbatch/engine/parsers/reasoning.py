"""Reasoning blocks (``<think>...</think>`` in Qwen3 / DeepSeek-R1 style, Gemma 4's thought
channel, gpt-oss harmony's analysis channel): where a request starts relative to one, when it
ends, and its text apart from the answer.

The markers are the ones mlx-lm's tokenizer wrapper infers from the vocabulary. Whether a request
starts inside a reasoning block is read from its own prompt: the tokens after the last start of
the template's generation prompt (``<|im_start|>`` for Qwen, ``<｜Assistant｜>`` for DeepSeek).
A start marker there (DeepSeek-R1 opens ``<think>`` itself) means inside; an end marker (Qwen3
with ``enable_thinking=False`` writes an empty block) means the answer comes next; neither means
the model decides, and a reasoning block opens if its first tokens are the start marker.

Harmony (gpt-oss) has no think tokens: the reasoning is the analysis message
(``<|channel|>analysis<|message|>...<|end|>``) and the answer the final one, which comes after a
header (``<|start|>assistant<|channel|>final<|message|>``, or ``<|channel|>final<|message|>`` when
the model answers at once). The header is template structure, not answer: it is cut from the
text, and a constrained request is made to write it before its grammar starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Phase(Enum):
    """Where a request's generation is relative to its reasoning block."""

    ANSWER = "answer"
    REASONING = "reasoning"
    MAYBE = "maybe"  # the model may open a reasoning block with its first tokens


@dataclass(frozen=True)
class ReasoningFormat:
    """A model's reasoning markers, as text and as token ids."""

    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    turn_start_id: int | None  # first token of the generation prompt
    # Text that opens the answer and is not part of it (harmony's final-channel header): the
    # first follows a reasoning block, the second opens a reply without one.
    answer_headers: tuple[str, ...] = ()
    answer_header_ids: tuple[int, ...] = ()  # the first, as tokens: forced for constraints
    # The tokens that open a new assistant message after the reasoning (harmony's
    # ``<|start|>assistant``): all that is forced before a grammar that writes its own channel
    # header (a harmony tool call's commentary channel and recipient).
    message_start_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: Any) -> ReasoningFormat | None:
        """The format of an mlx-lm ``TokenizerWrapper``, or None if it has no reasoning."""
        if getattr(tokenizer, "chat_template", None) is None:
            return None
        if getattr(tokenizer, "has_thinking", False):
            markers: dict[str, Any] = dict(
                start=tokenizer.think_start,
                end=tokenizer.think_end,
                start_ids=tuple(tokenizer.think_start_tokens),
                end_ids=tuple(tokenizer.think_end_tokens),
            )
        elif all(token in tokenizer.get_vocab() for token in HARMONY_TOKENS):
            markers = _harmony_markers(tokenizer)
        else:
            return None
        turn_start = None
        try:
            plain = tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=False, tokenize=True
            )
            with_prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=True
            )
            if len(with_prompt) > len(plain):
                turn_start = with_prompt[len(plain)]
        except Exception:  # a template that cannot render a bare user turn: no prompt hint
            turn_start = None
        return cls(turn_start_id=turn_start, **markers)

    def initial_phase(self, prompt_ids: Sequence[int]) -> Phase:
        """Whether generation after ``prompt_ids`` (a templated chat) starts inside reasoning."""
        tail_start = 0
        if self.turn_start_id is not None:
            for i in range(len(prompt_ids) - 1, -1, -1):
                if prompt_ids[i] == self.turn_start_id:
                    tail_start = i
                    break
        tail = list(prompt_ids[tail_start:])
        last_start = _rfind(tail, self.start_ids)
        last_end = _rfind(tail, self.end_ids)
        if last_start < 0 and last_end < 0:
            return Phase.MAYBE
        return Phase.REASONING if last_start > last_end else Phase.ANSWER


HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|channel|>", "<|message|>")


def _harmony_markers(tokenizer: Any) -> dict[str, Any]:
    """gpt-oss's channels as reasoning markers: analysis is the reasoning, final the answer."""
    start, end = "<|channel|>analysis<|message|>", "<|end|>"
    after_reasoning, at_once = (
        "<|start|>assistant<|channel|>final<|message|>",
        "<|channel|>final<|message|>",
    )

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    return dict(
        start=start,
        end=end,
        start_ids=ids(start),
        end_ids=ids(end),
        answer_headers=(after_reasoning, at_once),
        answer_header_ids=ids(after_reasoning),
        message_start_ids=ids(after_reasoning.removesuffix(at_once)),
    )


def _rfind(tokens: list[int], pattern: tuple[int, ...]) -> int:
    n = len(pattern)
    for i in range(len(tokens) - n, -1, -1):
        if tuple(tokens[i : i + n]) == pattern:
            return i
    return -1


@dataclass(frozen=True)
class ReasoningSplit:
    """Splits a reply's text into reasoning and answer, given where its tracker was."""

    format: ReasoningFormat
    starts_inside: bool
    phase: Phase

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, answer) of ``text``: reasoning is None when the request had none."""
        fmt = self.format
        if not self.starts_inside:
            if not text.startswith(fmt.start):
                if fmt.start.startswith(text) and self.phase is not Phase.ANSWER:
                    return "", ""  # the start marker is still arriving
                return None, self._answer(text)
            text = text[len(fmt.start) :]
        reasoning, ended, answer = text.partition(fmt.end)
        return reasoning.lstrip("\n"), self._answer(answer).lstrip("\n") if ended else ""

    def _answer(self, text: str) -> str:
        """``text`` without the answer header (nothing while the header is still arriving)."""
        for header in self.format.answer_headers:
            if text.startswith(header):
                return text[len(header) :]
            if header.startswith(text):
                return ""
        return text


class ReasoningTracker:
    """One request's phase, advanced token by token; splits its text into reasoning and answer."""

    def __init__(self, fmt: ReasoningFormat, phase: Phase) -> None:
        self.format = fmt
        self.phase = phase
        self.starts_inside = phase is Phase.REASONING
        self.answer_from: int | None = None  # output index where the answer followed reasoning
        # output index where the reasoning's text starts (after a start marker the model wrote)
        self.reasoning_from: int | None = 0 if self.starts_inside else None

    def advance(self, output_ids: Sequence[int]) -> None:
        """Update the phase after ``output_ids[-1]`` was appended."""
        fmt = self.format
        if self.phase is Phase.MAYBE:
            n = len(fmt.start_ids)
            if len(output_ids) <= n and tuple(output_ids) == fmt.start_ids[: len(output_ids)]:
                if len(output_ids) == n:
                    self.phase = Phase.REASONING
                    self.reasoning_from = n
                return
            self.phase = Phase.ANSWER
        elif self.phase is Phase.REASONING:
            n = len(fmt.end_ids)
            if tuple(output_ids[-n:]) == fmt.end_ids:
                self.phase = Phase.ANSWER
                self.answer_from = len(output_ids)

    def budget_token(self, index: int, budget: int, header: bool) -> int | None:
        """The token a thinking budget of ``budget`` tokens forces at output position ``index``
        (None: the model's choice): the end marker once the reasoning holds ``budget`` tokens,
        then (``header``) the answer header the format wants after it (harmony's final channel).
        """
        end = self.format.end_ids
        if self.phase is Phase.REASONING and self.reasoning_from is not None:
            k = index - self.reasoning_from - budget
            return end[k] if 0 <= k < len(end) else None
        closed_at = None if self.reasoning_from is None else self.reasoning_from + budget
        if header and closed_at is not None and self.answer_from == closed_at + len(end):
            return self.header_token(index, self.format.answer_header_ids)
        return None

    def budget_due(self, index: int, budget: int) -> bool:
        """Whether a budget may force a token at output position ``index`` or later without
        the tokens before it being known (the pipelined step reads them first when so)."""
        if self.phase is Phase.MAYBE:
            return True
        # the header after the end is due by position alone
        return (
            self.phase is Phase.REASONING
            and self.reasoning_from is not None
            and index - self.reasoning_from >= budget
        )

    def header_token(self, index: int, header: tuple[int, ...]) -> int | None:
        """``header``'s token due at output position ``index`` after the reasoning ended (None:
        no header there). A constrained request writes its header (``format.answer_header_ids``,
        or ``format.message_start_ids`` when its grammar writes its own channel) before its
        grammar starts."""
        if self.answer_from is None:
            return None
        k = index - self.answer_from
        return header[k] if 0 <= k < len(header) else None

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, answer) of ``text``: reasoning is None when the request had none."""
        return self.snapshot().split(text)

    def snapshot(self) -> ReasoningSplit:
        """What splitting the text needs as of now (an output splits its text when read)."""
        return ReasoningSplit(self.format, self.starts_inside, self.phase)

    def next_start_token(self, num_generated: int) -> int | None:
        """The start marker's next token while the model may still open a reasoning block."""
        if self.phase is Phase.MAYBE and num_generated < len(self.format.start_ids):
            return self.format.start_ids[num_generated]
        return None
