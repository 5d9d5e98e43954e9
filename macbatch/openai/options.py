"""Structured output and tools as request fields, in the names clients already send: OpenAI's
``response_format``, ``tools``, ``tool_choice`` and ``parallel_tool_calls``, and vLLM's extras
(``structured_outputs``, ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar``), turned into the engine's ``StructuredOutput``. Part of the one request layer
(``macbatch.openai``): serve's bodies, run's OpenAI-batch rows and job settings all come here; every
mistake is an ``InvalidRequest`` naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macbatch.engine.constraints import StructuredOutput
from macbatch.engine.tokenizer import Tokenizer
from macbatch.engine.tool_calls import ToolFormat, check_tools, chosen_tools
from macbatch.openai.errors import InvalidRequest

OPTION_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
)


def invalid(message: str, field: str) -> InvalidRequest:
    return InvalidRequest(message, field)


# vLLM's names -> StructuredOutput's
_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
_STRUCTURED_OUTPUTS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
}


@dataclass(frozen=True)
class ToolRequest:
    """The tools a chat request offers and how the reply should treat them (read from the body
    alone; ``bind`` checks them against the model)."""

    tools: list[dict[str, Any]]
    choice: Any  # tool_choice as sent: None, "none", "auto", "required" or a function
    forced: list[dict[str, Any]] | None  # the reply must call one of these
    parallel: bool


@dataclass(frozen=True)
class BoundTools:
    """A ``ToolRequest`` checked against the model's tool-call format."""

    tools: list[dict[str, Any]]  # for the chat template
    parse_with: ToolFormat | None  # read calls out of the reply with this (None: all text)
    constraint: StructuredOutput | None  # the grammar of a forced call


def structured_output(body: dict[str, Any]) -> StructuredOutput | None:
    """The one constraint a body asks for, from whichever field it used."""
    found: list[tuple[str, StructuredOutput]] = []
    response_format = _response_format(body.get("response_format"))
    if response_format is not None:
        found.append(("response_format", response_format))
    for name, kind in _GUIDED.items():
        if body.get(name) is not None:
            found.append((name, _build(name, {kind: body[name]})))
    extra = body.get("structured_outputs")
    if extra is not None:
        if not isinstance(extra, dict):
            raise invalid("'structured_outputs' must be an object", "structured_outputs")
        given = {_STRUCTURED_OUTPUTS[k]: v for k, v in extra.items() if k in _STRUCTURED_OUTPUTS}
        if given:
            found.append(("structured_outputs", _build("structured_outputs", given)))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise invalid(f"ask for one structured output, not several ({names})", found[1][0])
    return found[0][1] if found else None


def _response_format(value: Any) -> StructuredOutput | None:
    where = "response_format"
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise invalid(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                where,
            )
        return _build(where, {"json_schema": spec["schema"]})
    raise invalid(
        "response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}", where
    )


def _build(where: str, fields: dict[str, Any]) -> StructuredOutput:
    if "choice" in fields and isinstance(fields["choice"], list):
        fields = dict(fields, choice=tuple(fields["choice"]))
    try:
        return StructuredOutput(**fields)
    except ValueError as exc:
        raise invalid(f"{where}: {exc}", where) from None


def tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The body's tools, tool_choice and parallel_tool_calls, checked as far as they can be
    without the model."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise invalid("'tool_choice' needs 'tools'", "tool_choice")
        return None
    try:
        tools = check_tools(tools)
    except ValueError as exc:
        raise invalid(str(exc), "tools") from None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise invalid("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    try:
        forced = chosen_tools(tools, choice)
    except ValueError as exc:
        raise invalid(str(exc), "tool_choice") from None
    return ToolRequest(tools, choice, forced, parallel)


def bind_tools(
    request: ToolRequest, tool_format: ToolFormat | None, tokenizer: Tokenizer
) -> BoundTools:
    """What the model makes of the request: a forced choice needs a format macbatch can parse
    (and becomes a grammar); "auto" without one shows the tools and leaves the reply text."""
    parse = request.choice != "none" and tool_format is not None
    if request.forced is None:
        return BoundTools(request.tools, tool_format if parse else None, None)
    if tool_format is None:
        raise invalid(
            "this model's chat template has no tool-call format macbatch can parse, so "
            f"tool_choice {request.choice!r} cannot be honoured; use 'none' or leave out tools",
            "tool_choice",
        )
    try:
        grammar = tool_format.grammar(request.forced, request.parallel, tokenizer)
    except ValueError as exc:
        raise invalid(str(exc), "tool_choice") from None
    constraint = StructuredOutput(grammar=grammar, own_channel=tool_format.own_channel)
    return BoundTools(request.tools, tool_format, constraint)
