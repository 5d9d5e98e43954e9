"""Anthropic's Messages output: the ``message`` object (content blocks ``thinking``, ``text``,
``tool_use``; ``stop_reason``; usage) and its stream events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``), built from
the engine outputs of a ``MessagesRequest``. Streamed blocks equal the whole message's."""

from __future__ import annotations

import json
import uuid
from typing import Any

from macbatch.engine import FinishReason, RequestOutput, ToolCall, ToolFormat
from macbatch.openai.anthropic_api import MessagesRequest
from macbatch.openai.rendering import Event, Failure, Renderer, StreamedContent
from macbatch.openai.responses import TokenDecoder


class MessagesRenderer(Renderer):
    """One message (a Messages request has one choice)."""

    def __init__(
        self,
        request: MessagesRequest,
        tool_format: ToolFormat | None,
        model: str,
        decoder: TokenDecoder,
    ) -> None:
        self.request = request
        self.model = model
        self.decoder = decoder  # to tell which stop sequence ended a reply
        self.id = f"msg_{uuid.uuid4().hex}"
        self.reply = StreamedContent(tool_format)
        self._started = False
        self._blocks = 0  # content blocks opened (the next one's index)
        self._open: str | None = None  # "thinking" or "text" while one is streaming
        self._text_opened = False

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        [out] = finals
        content, calls = self.reply.parts(out)
        blocks: list[dict[str, Any]] = []
        if out.reasoning is not None:
            blocks.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
        if content or not calls:
            blocks.append({"type": "text", "text": content})
        blocks += [_tool_use(call) for call in calls]
        reason, sequence = self._stop(out, calls)
        return {
            **self._envelope(blocks, _usage(out)),
            "stop_reason": reason,
            "stop_sequence": sequence,
        }

    def _envelope(self, content: list, usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }

    def _stop(self, out: RequestOutput, calls: list[ToolCall]) -> tuple[str, str | None]:
        """(stop_reason, the stop sequence that ended the reply, if one did)."""
        if calls:
            return "tool_use", None
        if out.finish_reason is FinishReason.LENGTH:
            return "max_tokens", None
        whole = self.decoder.decode(out.token_ids) if self.request.stop_sequences else ""
        found = [(whole.find(s), s) for s in self.request.stop_sequences if s in whole]
        return ("stop_sequence", min(found)[1]) if found else ("end_turn", None)

    # the stream

    def step(self, index: int, out: RequestOutput) -> list[Event]:
        events = []
        if not self._started:
            self._started = True
            usage = dict(_usage(out), output_tokens=0)
            events.append(_event("message_start", message=self._envelope([], usage)))
        if out.new_reasoning:
            if self._open != "thinking":
                events += self._close() + self._start(
                    {"type": "thinking", "thinking": "", "signature": ""}
                )
            events.append(self._delta({"type": "thinking_delta", "thinking": out.new_reasoning}))
        text = self.reply.new_text(out)
        if text:
            if self._open != "text":
                events += self._close() + self._start({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": text}))
        if out.finished:
            content, calls = self.reply.parts(out)
            if not self._text_opened and (content or not calls):
                events += self._close() + self._start({"type": "text", "text": ""})
            events += self._close()
            for call in calls:
                start = dict(_tool_use(call), input={})
                events += self._start(start, opened=None)
                events.append(
                    self._delta({"type": "input_json_delta", "partial_json": call.arguments})
                )
                events += self._close()
        return events

    def close(self, finals: list[RequestOutput]) -> list[Event]:
        final = self.response(finals)
        delta = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
        usage = {"output_tokens": final["usage"]["output_tokens"]}
        return [_event("message_delta", delta=delta, usage=usage), _event("message_stop")]

    def failed(self, error: Failure) -> list[Event]:
        return [("error", dict(error.anthropic_body()))]

    def _start(self, block: dict[str, Any], opened: str | None = "") -> list[Event]:
        self._open = block["type"] if opened == "" else "tool_use"
        self._text_opened = self._text_opened or block["type"] == "text"
        self._blocks += 1
        return [_event("content_block_start", index=self._blocks - 1, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return _event("content_block_delta", index=self._blocks - 1, delta=delta)

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._blocks - 1)]


def _event(kind: str, **fields: Any) -> Event:
    return kind, {"type": kind, **fields}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):  # a call whose arguments are no object: kept as text
        arguments = {"arguments": call.arguments}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _usage(out: RequestOutput) -> dict[str, Any]:
    """Anthropic counts cache reads apart from ``input_tokens``."""
    cached = out.metrics.cached_tokens
    return {
        "input_tokens": out.metrics.prompt_tokens - cached,
        "output_tokens": len(out.token_ids),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
