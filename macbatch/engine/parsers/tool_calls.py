"""Tool calls: the request's tools checked, the chat history's calls and results made ready for
the model's own template, and ``ToolFormat``: one model family's call syntax (a ``CallSyntax``
from the registry in ``tool_formats/``) with what detection found out about its template.

A syntax parses a finished reply into calls, says how much of a streaming reply is surely words,
and writes the Lark grammar that forces ``tool_choice`` "required" or a named function. The
format is detected once at load by rendering a probe call through the model's own template
(``tool_formats/detect.py``); docs/serve.md lists the families.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from macbatch.engine.tokenizer import Tokenizer

TOOL_CHOICES = ("none", "auto", "required")


Function = tuple[str, dict[str, Any]]  # a tool's name and its parameters' schema


# [(name, arguments)] as a reply wrote them: names not checked yet (``parse`` does).
RawCalls = list[tuple[Any, Any]]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str
    id: str

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    """Nine letters and digits: the one id shape every template accepts (Mistral's demands it)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


Schemas = Mapping[str, dict[str, Any]]  # each tool's parameters' schema, by tool name


class CallSyntax(Protocol):
    """How one model family writes tool calls; one file per family in ``tool_formats/``."""

    @property
    def family(self) -> str:
        """The name ``doctor`` and the docs use."""

    @property
    def markers(self) -> tuple[str, ...]:
        """Texts every call it writes has: detection looks for all of them."""

    @property
    def starts(self) -> tuple[str, ...]:
        """Texts that may open the call part of a reply (none: the reply is the call)."""

    @property
    def own_channel(self) -> bool:
        """The grammar writes the reply's channel header (harmony: the commentary channel and
        the recipient), so the engine must not open the final channel first."""

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        """(content, calls) of a reply, or None when it holds no call in this syntax.
        ``schemas`` type the values of syntaxes that write arguments as text."""
        ...

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        """A Lark grammar whose every reply is one call (more if ``parallel`` and the family
        can) to one of ``functions``, with arguments valid against its schema."""
        ...


@runtime_checkable
class WritesCalls(Protocol):
    """A syntax that can write calls as the model does, for templates that render a history's
    calls only as part of the assistant's content (LFM2's)."""

    def write(self, calls: RawCalls) -> str: ...


@runtime_checkable
class NamesCalls(Protocol):
    """A syntax that writes a call's name in a form of its own (Kimi's ``functions.NAME:0``),
    which a template may take from the call's id instead of its name (Kimi K2 Thinking's)."""

    def written_name(self, name: str, index: int) -> str:
        """How call ``index`` of a reply, to ``name``, is named in this syntax."""
        ...


@dataclass(frozen=True)
class ToolFormat:
    """A model's tool-call syntax, how its template takes the history's calls
    (``text_arguments``: arguments as JSON text, not a mapping; ``calls_in_content``: written
    into the content by the syntax, the template renders no ``tool_calls``; ``ids_as_names``:
    the template writes each call's id where the syntax has its name, so the history's ids
    become the names as the syntax writes them), and the request's tools (``schemas``) once
    bound to one."""

    syntax: CallSyntax
    text_arguments: bool = False
    calls_in_content: bool = False
    ids_as_names: bool = False
    schemas: Schemas = field(default_factory=dict, compare=False, hash=False)

    @property
    def family(self) -> str:
        return self.syntax.family

    @property
    def own_channel(self) -> bool:
        return self.syntax.own_channel

    def for_tools(self, tools: Sequence[dict[str, Any]]) -> ToolFormat:
        """This format reading calls to ``tools`` (checked): values typed by their schemas."""
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        return replace(self, schemas=schemas)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a finished reply; a reply whose calls do not parse is content."""
        found = self.syntax.split(text, self.schemas)
        if found is None:
            return text, []
        content, raw = found
        calls = []
        for name, arguments in raw:
            if not isinstance(name, str) or not name:
                return text, []
            args = (
                arguments
                if isinstance(arguments, str)
                else json.dumps(arguments, ensure_ascii=False)
            )
            calls.append(ToolCall(name, args, new_call_id()))
        return content, calls

    def grammar(self, tools: Sequence[dict[str, Any]], parallel: bool, tokenizer: Tokenizer) -> str:
        """The syntax's grammar for ``tools`` (already checked)."""
        functions = [
            (t["function"]["name"], t["function"].get("parameters") or {"type": "object"})
            for t in tools
        ]
        return self.syntax.grammar(functions, parallel, tokenizer)

    def content_end(self, text: str) -> int:
        """How much of a reply still streaming is surely words, not the start of a call."""
        if not self.syntax.starts:  # the reply itself is the call when it starts like one
            head = text.lstrip()
            return 0 if not head or head.startswith(("{", "<|python_tag|>")) else len(text)
        return min(_words_before(text, start) for start in self.syntax.starts)


def _words_before(text: str, start: str) -> int:
    """Where ``start`` begins in ``text``, or where a part of it ends ``text``."""
    at = text.find(start)
    if at >= 0:
        return at
    for k in range(min(len(start) - 1, len(text)), 0, -1):
        if text.endswith(start[:k]):
            return len(text) - k
    return len(text)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI-shaped function tools, checked; ``ValueError`` says which one is wrong."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("'tools' must be a non-empty list of {type: function, function: {...}}")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ValueError(f"{where} must be {{'type': 'function', 'function': {{...}}}}")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"{where}.function must be an object with a string 'name'")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", function["name"]):
            raise ValueError(f"{where}.function.name must be 1-64 letters, digits, _ . or -")
        if function["name"] in names:
            raise ValueError(f"{where}: two tools are named {function['name']!r}")
        names.add(function["name"])
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ValueError(f"{where}.function.parameters must be a JSON schema object")
    return tools


def chosen_tools(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]] | None:
    """The tools a reply must call from (None: the model may answer in words).

    ``choice``: "none", "auto" (None), "required", or {"type": "function", "function":
    {"name": ...}}; an unknown name is a ``ValueError``.
    """
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return tools
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise ValueError(
            "tool_choice must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}"
        )
    picked = [t for t in tools if t["function"]["name"] == name]
    if not picked:
        known = ", ".join(t["function"]["name"] for t in tools)
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({known})")
    return picked


def template_messages(
    messages: Sequence[dict[str, Any]], fmt: ToolFormat | None = None
) -> list[dict[str, Any]]:
    """Chat messages ready for a template: assistant ``tool_calls`` in the shape ``fmt`` says
    the template takes (arguments as objects, which most templates serialize; as JSON text for
    the templates that concatenate them, DeepSeek V3.1's; or written into the content for those
    that render no calls, LFM2's); tool results kept; ``ValueError`` on malformed ones."""
    out = []
    renamed: dict[str, str] = {}  # ids_as_names: a call's id as the client sent it -> written
    for i, message in enumerate(messages):
        where = f"chat message {i}"
        role, content = message.get("role"), message.get("content")
        calls = message.get("tool_calls")
        if not isinstance(role, str):
            raise ValueError(f"{where} must have a string 'role', got {message}")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise ValueError(f"{where}: only an assistant message has a list of tool_calls")
            calls = _history_calls(calls, where, fmt is not None and fmt.text_arguments)
            if fmt is not None and fmt.ids_as_names and isinstance(fmt.syntax, NamesCalls):
                calls = _named_ids(calls, fmt.syntax, renamed)
            message = dict(message, content=content or "", tool_calls=calls)
            if fmt is not None and fmt.calls_in_content and isinstance(fmt.syntax, WritesCalls):
                raw = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
                message = {"role": role, "content": (content or "") + fmt.syntax.write(raw)}
        elif not isinstance(content, (str, list)):  # a list: parts check_content_parts read
            raise ValueError(f"{where} must have string 'role' and 'content' fields, got {message}")
        if role == "tool" and not isinstance(message.get("tool_call_id", ""), str):
            raise ValueError(f"{where}: a tool result's tool_call_id must be a string")
        if role == "tool" and message.get("tool_call_id") in renamed:
            message = dict(message, tool_call_id=renamed[message["tool_call_id"]])
        out.append(message)
    return out


def _named_ids(
    calls: list[dict[str, Any]], syntax: NamesCalls, renamed: dict[str, str]
) -> list[dict[str, Any]]:
    """The calls with ids that name them as ``syntax`` writes names (``renamed`` learns each
    id's new one, for the results that answer it)."""
    out = []
    for j, call in enumerate(calls):
        written = syntax.written_name(call["function"]["name"], j)
        if isinstance(call.get("id"), str):
            renamed[call["id"]] = written
        out.append(dict(call, id=written))
    return out


def _history_calls(calls: list[Any], where: str, text_arguments: bool) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"{where}.tool_calls[{j}] needs a 'function' with a string 'name'")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {exc}"
                ) from None
        if not isinstance(arguments, dict):
            raise ValueError(f"{where}.tool_calls[{j}].function.arguments must be a JSON object")
        if text_arguments:
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(dict(call, function={"name": function["name"], "arguments": arguments}))
    return out
