"""OpenAI response objects built from engine outputs: whole answers, stream chunks, usage and
logprobs, for chat (``chat.completion``) and legacy completions (``text_completion``). serve
answers with them (a ``Formatter`` is those endpoints' ``Renderer``) and run writes them into its
result lines, so a reply has one JSON shape."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

from macbatch.engine import RequestOutput, ToolFormat
from macbatch.openai.rendering import Event, Failure, Renderer, StreamedContent
from macbatch.openai.requests import Endpoint, Generation

LOWEST_LOGPROB = -9999.0  # OpenAI's logprob for a token with no chance (JSON has no -inf)


class TokenDecoder(Protocol):
    """What logprobs need from a tokenizer: the text of a token."""

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass
class ChoiceProgress:
    """What one choice has streamed so far, so every chunk carries only the new part."""

    content: StreamedContent = field(default_factory=lambda: StreamedContent(None))  # chat's
    tokens_sent: int = 0
    text_offset: int = 0  # legacy completions' logprobs: the characters of the tokens sent
    started: bool = False


@dataclass
class Formatter(Renderer, ABC):
    """Shared by both endpoints: the response id, model name, logprobs and usage; as a stream,
    each choice's chunks, the usage chunk if asked for, then ``[DONE]``."""

    model: str
    decoder: TokenDecoder
    top_logprobs: int | None
    n: int
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    tool_format: ToolFormat | None = None  # set when the reply's tool calls are to be parsed
    include_usage: bool = False  # a stream's last chunk carries the usage (stream_options)
    _progress: dict[int, ChoiceProgress] = field(default_factory=dict, init=False, repr=False)

    object_name = ""
    chunk_object_name = ""
    id_prefix = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.id_prefix}{uuid.uuid4().hex}"

    def envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        """The non-streaming answer: every choice's final output, in choice order."""
        choices = [self.final_choice(i, out) for i, out in enumerate(finals)]
        body = self.envelope(self.object_name, choices)
        body["usage"] = usage(finals, self.n)
        return body

    def usage_chunk(self, finals: list[RequestOutput]) -> dict[str, Any]:
        """The last chunk of a stream with ``stream_options.include_usage``."""
        body = self.envelope(self.chunk_object_name, [])
        body["usage"] = usage(finals, self.n)
        return body

    def step(self, index: int, out: RequestOutput) -> list[Event]:
        return [(None, chunk) for chunk in self.chunks(index, out)]

    def close(self, finals: list[RequestOutput]) -> list[Event]:
        usage = [(None, self.usage_chunk(finals))] if self.include_usage else []
        return [*usage, (None, "[DONE]")]

    def failed(self, error: Failure) -> list[Event]:
        return [(None, dict(error.body())), (None, "[DONE]")]

    def chunks(self, index: int, out: RequestOutput) -> list[dict]:
        """Stream chunks for one engine output of choice ``index`` (possibly none)."""
        progress = self._progress.get(index)
        if progress is None:
            progress = self._progress[index] = ChoiceProgress(StreamedContent(self.tool_format))
        return self.choice_chunks(index, out, progress)

    @abstractmethod
    def choice_chunks(self, index: int, out: RequestOutput, progress: ChoiceProgress) -> list[dict]:
        """``chunks``, given what the choice has streamed so far (advanced past this output)."""

    @abstractmethod
    def final_choice(self, index: int, out: RequestOutput) -> dict[str, Any]:
        """A choice of the non-streaming answer, from the choice's final output."""

    def token_text(self, token_id: int) -> str:
        return self.decoder.decode([token_id])

    def new_logprobs(self, out: RequestOutput, start: int) -> list[tuple[int, float, dict]]:
        """(token, logprob, top alternatives) for the tokens from ``start`` on."""
        if self.top_logprobs is None or out.logprobs is None:
            return []
        tops = out.top_logprobs or [{} for _ in out.logprobs]  # one per token, as logprobs
        return [
            (token, _finite(logprob), {t: _finite(lp) for t, lp in top.items()})
            for token, logprob, top in zip(
                out.token_ids[start:], out.logprobs[start:], tops[start:]
            )
        ]


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def final_choice(self, index: int, out: RequestOutput) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": out.text}
        message.update(_reasoning(out.reasoning))
        finish_reason = _finish_reason(out)
        content, calls = StreamedContent(self.tool_format).parts(out)
        if calls:
            message.update(content=content or None, tool_calls=[c.openai() for c in calls])
            finish_reason = "tool_calls"
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs(out, 0),
            "finish_reason": finish_reason,
        }

    def choice_chunks(self, index: int, out: RequestOutput, progress: ChoiceProgress) -> list[dict]:
        """Role first, then reasoning and content deltas (content that may be the start of a
        tool call is held back until the reply ends), tool calls, then the finish reason."""
        chunks = []
        if not progress.started:
            progress.started = True
            chunks.append(self._chunk(index, {"role": "assistant", "content": ""}))
        if out.new_reasoning:
            chunks.append(self._chunk(index, _reasoning(out.new_reasoning)))
        new_text = progress.content.new_text(out)
        logprobs = self.logprobs(out, progress.tokens_sent)
        if new_text or (logprobs and logprobs["content"]):
            chunks.append(self._chunk(index, {"content": new_text}, logprobs=logprobs))
        progress.tokens_sent = len(out.token_ids)
        calls = progress.content.parts(out)[1] if out.finished else []
        if calls:
            deltas = [dict(c.openai(), index=k) for k, c in enumerate(calls)]
            chunks.append(self._chunk(index, {"tool_calls": deltas}))
        if out.finished:
            reason = "tool_calls" if calls else _finish_reason(out)
            chunks.append(self._chunk(index, {}, finish_reason=reason))
        return chunks

    def _chunk(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: dict | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return self.envelope(self.chunk_object_name, [choice])

    def logprobs(self, out: RequestOutput, start: int) -> dict | None:
        if self.top_logprobs is None:
            return None
        return {
            "content": [
                {
                    **self._token_entry(token, logprob),
                    "top_logprobs": [self._token_entry(t, lp) for t, lp in _ranked(top)],
                }
                for token, logprob, top in self.new_logprobs(out, start)
            ]
        }

    def _token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


class CompletionFormatter(Formatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl-"

    def final_choice(self, index: int, out: RequestOutput) -> dict[str, Any]:
        return {
            "index": index,
            "text": out.text,
            "logprobs": self.logprobs(out, ChoiceProgress()),
            "finish_reason": _finish_reason(out),
        }

    def choice_chunks(self, index: int, out: RequestOutput, progress: ChoiceProgress) -> list[dict]:
        """One chunk per step with new text; the last one carries the finish reason."""
        logprobs = self.logprobs(out, progress)
        if not (out.new_text or out.finished or (logprobs and logprobs["tokens"])):
            return []
        choice = {
            "index": index,
            "text": out.new_text,
            "logprobs": logprobs,
            "finish_reason": _finish_reason(out) if out.finished else None,
        }
        return [self.envelope(self.chunk_object_name, [choice])]

    def logprobs(self, out: RequestOutput, progress: ChoiceProgress) -> dict | None:
        """The legacy layout: parallel lists; advances ``progress`` past the tokens rendered."""
        if self.top_logprobs is None:
            return None
        result: dict[str, list] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token, logprob, top in self.new_logprobs(out, progress.tokens_sent):
            text = self.token_text(token)
            result["tokens"].append(text)
            result["token_logprobs"].append(logprob)
            result["top_logprobs"].append({self.token_text(t): lp for t, lp in _ranked(top)})
            result["text_offset"].append(progress.text_offset)
            progress.text_offset += len(text)
        progress.tokens_sent = len(out.token_ids)
        return result


def usage(finals: list[RequestOutput], n: int) -> dict[str, Any]:
    """Token counts (the prompt once per prompt, not once per choice), time to first token and
    decode speed (tokens after each choice's first, over the time since the first token)."""
    metrics = [out.metrics for out in finals]
    prompt_tokens = sum(m.prompt_tokens for m in metrics[::n])
    completion_tokens = sum(len(out.token_ids) for out in finals)
    firsts = [m.first_token_time for m in metrics if m.first_token_time is not None]
    ttft = tokens_per_second = None
    if firsts:
        ttft = min(firsts) - min(m.arrival_time for m in metrics)
        end = max(m.finished_time or time.monotonic() for m in metrics)
        if end > min(firsts):
            tokens_per_second = (completion_tokens - len(firsts)) / (end - min(firsts))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(m.cached_tokens for m in metrics[::n])},
        "time_to_first_token_s": ttft,
        "tokens_per_second": tokens_per_second,
    }


def _reasoning(text: str | None) -> dict[str, str]:
    """Reasoning under both names clients read: ``reasoning_content`` (DeepSeek, vLLM) and
    ``reasoning`` (OpenRouter, newer vLLM)."""
    return {} if text is None else {"reasoning_content": text, "reasoning": text}


def _finite(logprob: float) -> float:
    """A token a constraint masked out has logprob -inf, which JSON cannot carry: OpenAI's
    lowest value, ``LOWEST_LOGPROB``, stands for it."""
    return max(logprob, LOWEST_LOGPROB)


def _ranked(top: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda item: -item[1])


def _finish_reason(out: RequestOutput) -> str | None:
    return None if out.finish_reason is None else str(out.finish_reason.value)


def formatter_for(
    generation: Generation,
    parse_with: ToolFormat | None,
    model: str,
    decoder: TokenDecoder,
    key: str | None = None,
) -> Formatter:
    """The formatter of ``generation``'s endpoint; ``key`` makes the response id stable (run
    derives it from the request's resume key), else it is random."""
    cls: type[Formatter] = (
        ChatFormatter if generation.endpoint is Endpoint.CHAT else CompletionFormatter
    )
    response_id = f"{cls.id_prefix}{key}" if key else ""
    return cls(
        model,
        decoder,
        generation.top_logprobs,
        generation.n,
        response_id,
        tool_format=parse_with,
        include_usage=generation.include_usage,
    )
