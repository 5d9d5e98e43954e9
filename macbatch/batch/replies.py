"""What a job asks of each reply (a schema, choices, tools) and what came back: the
``StructuredOutput`` and tools a request runs with, and the reply parsed for its result line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from macbatch.engine import StructuredOutput, ToolFormat


@dataclass(frozen=True)
class ParsedReply:
    """A constrained reply read back: ``value`` is the JSON, the chosen string or the tool calls
    (None when it did not parse, e.g. cut off by max_tokens)."""

    value: Any
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class ReplyShape:
    """What constrained a request's reply, to read it back."""

    structured: StructuredOutput | None = None
    tool_format: ToolFormat | None = None  # set when the reply's tool calls are to be parsed

    def parse(self, text: str) -> ParsedReply | None:
        """The reply read back, or None when nothing constrained it."""
        if self.tool_format is not None:
            content, calls = self.tool_format.parse(text)
            if not calls:
                return ParsedReply(None, text)
            value = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
            return ParsedReply(value, content, [c.openai() for c in calls])
        spec = self.structured
        if spec is None:
            return None
        if spec.schema is not None:
            try:
                return ParsedReply(json.loads(text))
            except json.JSONDecodeError:
                return ParsedReply(None)
        if spec.choice is not None:
            return ParsedReply(text if text in spec.choice else None)
        return None  # a regex or grammar: the text itself is the reply


def scored_answer(text: str, parsed: ParsedReply | None, field: str | None) -> str:
    """What scoring compares: the reply, or one field of its parsed JSON (as text)."""
    if field is None:
        return text
    value = (
        parsed.value.get(field) if parsed is not None and isinstance(parsed.value, dict) else None
    )
    if value is None or isinstance(value, str):
        return value or ""
    return json.dumps(value, ensure_ascii=False)
