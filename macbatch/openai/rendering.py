"""What every API shape does with engine outputs, so serve's routes share one streaming loop.

Chat completions, the Responses API and Anthropic's Messages API are different shapes over the
same engine requests: each has a ``Renderer`` that turns outputs into its whole answer and into
its server-sent events (``Event``: an event name, or None for a bare ``data:`` line, and the data);
chat's and legacy completions' is their ``Formatter`` (``responses.py``). ``StreamedContent`` is
the part they share: what of a streaming reply's content is surely words (text that may open a
tool call is held back until the reply ends) and a finished reply's content and calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol

from macbatch.engine import FinishReason, RequestOutput, ToolCall, ToolFormat

Event = tuple[str | None, dict[str, Any] | str]  # (SSE event name or None, data)


class Failure(Protocol):
    """An error that ends a stream after it started (serve's ``APIError``)."""

    status: int
    message: str
    code: str | None

    def body(self) -> dict[str, object]: ...

    def anthropic_body(self) -> dict[str, object]: ...


class Renderer(ABC):
    """One API's answer to a generation: whole, or as events (``open``, ``step`` per output,
    then ``close`` with every choice's final output, or ``failed``)."""

    @abstractmethod
    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        """The whole answer (the same object a stream's last event carries, where it has one)."""

    def open(self) -> list[Event]:
        return []

    @abstractmethod
    def step(self, index: int, out: RequestOutput) -> list[Event]: ...

    @abstractmethod
    def close(self, finals: list[RequestOutput]) -> list[Event]: ...

    @abstractmethod
    def failed(self, error: Failure) -> list[Event]: ...


@dataclass
class StreamedContent:
    """One reply's content as it streams: the answer text sent so far, and the finished
    reply's content and tool calls."""

    tool_format: ToolFormat | None
    chars_sent: int = 0
    _parts: tuple[str, list[ToolCall]] | None = None

    def parts(self, out: RequestOutput) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a finished reply, parsed once (call ids are fresh per parse); a
        reply cut off, or read without a tool format, is all content."""
        if self._parts is None:
            if self.tool_format is None or out.finish_reason is not FinishReason.STOP:
                self._parts = (out.text, [])
            else:
                self._parts = self.tool_format.parse(out.text)
        return self._parts

    def new_text(self, out: RequestOutput) -> str:
        """Answer text not sent yet that is surely words (all of the content once finished)."""
        if out.finished:
            content = self.parts(out)[0]
            end = len(content)
        else:
            content = out.text
            end = len(content)
            if self.tool_format is not None:
                end = self.tool_format.content_end(content)
        new = content[self.chars_sent : end] if end > self.chars_sent else ""
        self.chars_sent = max(self.chars_sent, end)
        return new
