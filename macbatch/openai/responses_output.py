"""The Responses API's output: the ``response`` object (``output`` items: ``reasoning``,
``message`` with ``output_text``, ``function_call``) and its documented stream events, built from
the engine outputs of a ``ResponsesRequest``. The streamed items carry the same ids and text as
the final object, so a client's reassembled stream equals the whole response."""

from __future__ import annotations

import time
import uuid
from typing import Any

from macbatch.engine import FinishReason, RequestOutput, ToolCall, ToolFormat
from macbatch.openai.rendering import Event, Failure, Renderer, StreamedContent
from macbatch.openai.responses import usage
from macbatch.openai.responses_api import ResponsesRequest


class ResponsesRenderer(Renderer):
    """One response (Responses requests have one choice)."""

    def __init__(
        self,
        request: ResponsesRequest,
        tool_format: ToolFormat | None,
        model: str,
        response_id: str | None = None,  # a batch's stable one; else random
    ) -> None:
        self.request = request
        self.model = model
        self.id = response_id or f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.reply = StreamedContent(tool_format)
        self._reasoning_id = f"rs_{uuid.uuid4().hex}"
        self._message_id = f"msg_{uuid.uuid4().hex}"
        self._final: dict[str, Any] | None = None
        self._sequence = 0
        self._items = 0  # output items opened so far (the next one's output_index)
        self._open: str | None = None  # "reasoning" or "message" while one is streaming
        self._message_index: int | None = None
        self._reasoning_index: int | None = None
        self._reasoning = ""
        self._text = ""

    # the whole response

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        if self._final is None:
            [out] = finals
            content, calls = self.reply.parts(out)
            output = []
            if out.reasoning is not None:
                output.append(self._reasoning_item(out.reasoning, "completed"))
            if content or not calls:
                output.append(self._message_item(content, "completed"))
            output += [self._call_item(call, "completed") for call in calls]
            self._final = self._object(_status(out), output, _usage(finals))
            if out.finish_reason is FinishReason.LENGTH:
                self._final["incomplete_details"] = {"reason": "max_output_tokens"}
        return self._final

    def conversation(self, finals: list[RequestOutput]) -> list[dict[str, Any]]:
        """The conversation after this response, as ``previous_response_id`` continues it: the
        request's (without instructions) and the reply, as the input items a client would send."""
        [out] = finals
        content, calls = self.reply.parts(out)
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [call.openai() for call in calls]
        return [*self.request.conversation, reply]

    def _object(self, status: str, output: list, usage: dict | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": output,
            "previous_response_id": self.request.previous_response_id,
            "store": self.request.store,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            **self.request.echo,
        }

    def _reasoning_item(self, text: str, status: str) -> dict[str, Any]:
        return {
            "id": self._reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": status,
        }

    def _message_item(self, text: str | None, status: str) -> dict[str, Any]:
        parts = [] if text is None else [_text_part(text)]
        return {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": parts,
        }

    def _call_item(self, call: ToolCall, status: str, arguments: str | None = None) -> dict:
        return {
            "id": f"fc_{call.id}",
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments if arguments is None else arguments,
            "status": status,
        }

    # the stream

    def _event(self, kind: str, **fields: Any) -> Event:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def open(self) -> list[Event]:
        start = self._object("in_progress", [], None)
        return [
            self._event("response.created", response=start),
            self._event("response.in_progress", response=start),
        ]

    def step(self, index: int, out: RequestOutput) -> list[Event]:
        """Reasoning deltas, then answer deltas (words only: a possible call is held back);
        once the reply ends, its items close and its calls follow, one item each."""
        events = []
        if out.new_reasoning:
            if self._open is None:
                events += self._open_reasoning()
            self._reasoning += out.new_reasoning
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    **self._at("reasoning"),
                    delta=out.new_reasoning,
                )
            )
        text = self.reply.new_text(out)
        if text:
            if self._open != "message":
                events += self._close_open() + self._open_message()
            self._text += text
            events.append(
                self._event(
                    "response.output_text.delta", **self._at("message"), delta=text, logprobs=[]
                )
            )
        if out.finished:
            content, calls = self.reply.parts(out)
            if self._message_index is None and (content or not calls):
                events += self._close_open() + self._open_message()
            events += self._close_open()
            for call in calls:
                events += self._call_events(call)
        return events

    def close(self, finals: list[RequestOutput]) -> list[Event]:
        final = self.response(finals)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [self._event(kind, response=final)]

    def failed(self, error: Failure) -> list[Event]:
        return [self._event("error", code=error.code, message=error.message, param=None)]

    def _at(self, kind: str) -> dict[str, Any]:
        index = self._reasoning_index if kind == "reasoning" else self._message_index
        item = self._reasoning_id if kind == "reasoning" else self._message_id
        return {"item_id": item, "output_index": index, "content_index": 0}

    def _added(self, item: dict[str, Any]) -> Event:
        self._items += 1
        return self._event("response.output_item.added", output_index=self._items - 1, item=item)

    def _open_reasoning(self) -> list[Event]:
        self._open, self._reasoning_index = "reasoning", self._items
        item = dict(self._reasoning_item("", "in_progress"), content=[])
        part = {"type": "reasoning_text", "text": ""}
        return [
            self._added(item),
            self._event("response.content_part.added", **self._at("reasoning"), part=part),
        ]

    def _open_message(self) -> list[Event]:
        self._open, self._message_index = "message", self._items
        part = _text_part("")
        return [
            self._added(self._message_item(None, "in_progress")),
            self._event("response.content_part.added", **self._at("message"), part=part),
        ]

    def _close_open(self) -> list[Event]:
        kind, self._open = self._open, None
        if kind == "reasoning":
            item = self._reasoning_item(self._reasoning, "completed")
            done = self._event(
                "response.reasoning_text.done", **self._at(kind), text=self._reasoning
            )
        elif kind == "message":
            item = self._message_item(self._text, "completed")
            done = self._event(
                "response.output_text.done", **self._at(kind), text=self._text, logprobs=[]
            )
        else:
            return []
        at = self._at(kind)
        return [
            done,
            self._event("response.content_part.done", **at, part=item["content"][0]),
            self._event("response.output_item.done", output_index=at["output_index"], item=item),
        ]

    def _call_events(self, call: ToolCall) -> list[Event]:
        index = self._items
        at = {"item_id": f"fc_{call.id}", "output_index": index}
        return [
            self._added(self._call_item(call, "in_progress", arguments="")),
            self._event("response.function_call_arguments.delta", **at, delta=call.arguments),
            self._event(
                "response.function_call_arguments.done",
                **at,
                name=call.name,
                arguments=call.arguments,
            ),
            self._event(
                "response.output_item.done",
                output_index=index,
                item=self._call_item(call, "completed"),
            ),
        ]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(out: RequestOutput) -> str:
    if out.finish_reason is FinishReason.LENGTH:
        return "incomplete"
    return "cancelled" if out.finish_reason is FinishReason.ABORT else "completed"


def _usage(finals: list[RequestOutput]) -> dict[str, Any]:
    """Responses' usage from the chat counts (reasoning tokens are not counted apart: 0; the
    prefix cache's writes are not billed, so ``cache_write_tokens`` is 0)."""
    counts = usage(finals, 1)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {**counts["prompt_tokens_details"], "cache_write_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }
