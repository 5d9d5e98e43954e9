"""Tool calls: the request's tools checked, the chat history's calls and results made ready for
the model's own template, and each model family's call format parsed out of a reply (or forced
by a grammar for ``tool_choice`` "required" or a named function).

The family is detected from the chat template, one table row per format:

- ``hermes`` (Qwen 2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``
- ``llama3_json`` (Llama 3.1-3.3): the whole reply is ``{"name": ..., "parameters": {...}}``
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>``
  or ``to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>``
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from macbatch.engine.constraints import JSON_LAYOUT
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


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls (see the module docstring)."""

    family: str
    starts: tuple[str, ...]  # texts that may open the call part of a reply (none: the reply)
    split: Callable[[str], tuple[str, RawCalls] | None]
    grammar_of: Callable[[list[Function], bool, Any], str]  # (functions, parallel, tokenizer)
    # The grammar writes the reply's channel header (harmony: the commentary channel and the
    # recipient), so the engine must not open the final channel first.
    own_channel: bool = False

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a finished reply; a reply whose calls do not parse is content."""
        found = self.split(text)
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
        """A Lark grammar whose every reply is one call (or more if ``parallel`` and the family
        can) to one of ``tools`` (already checked), with arguments valid against its
        ``parameters``."""
        functions = [
            (t["function"]["name"], t["function"].get("parameters") or {"type": "object"})
            for t in tools
        ]
        return self.grammar_of(functions, parallel, tokenizer)

    def content_end(self, text: str) -> int:
        """How much of a reply still streaming is surely words, not the start of a call."""
        if not self.starts:  # the reply itself is the call when it starts like one
            head = text.lstrip()
            return 0 if not head or head.startswith(("{", "<|python_tag|>")) else len(text)
        return min(_words_before(text, start) for start in self.starts)


def _words_before(text: str, start: str) -> int:
    """Where ``start`` begins in ``text``, or where a part of it ends ``text``."""
    at = text.find(start)
    if at >= 0:
        return at
    for k in range(min(len(start) - 1, len(text)), 0, -1):
        if text.endswith(start[:k]):
            return len(text) - k
    return len(text)


def _call_schema(functions: list[Function], args_key: str) -> dict[str, Any]:
    """The schema of a JSON call object ``{"name": ..., args_key: {...}}`` to one function."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, args_key: parameters},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for name, parameters in functions
    ]
    return {"anyOf": options} if len(options) > 1 else options[0]


def _json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule body for JSON valid against ``schema``, laid out as the engine's JSON is."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _literal(tokenizer: Tokenizer, text: str) -> str:
    """A Lark terminal for ``text``: the token itself where the vocabulary has it as one added
    token (grammars see added tokens as tokens, not as their text), else the quoted text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ids[0] in getattr(tokenizer, "added_tokens_decoder", {}):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def _json_prefix(text: str) -> tuple[Any, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None


def _hermes_split(text: str) -> tuple[str, RawCalls] | None:
    blocks = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.DOTALL)
    if not blocks:
        return None
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict):
            return None
        calls.append((call.get("name"), call.get("arguments", {})))
    return text[: text.index("<tool_call>")].strip(), calls


def _hermes_grammar(functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
    call = _call_schema(functions, "arguments")
    more = ' ("\\n" call)*' if parallel else ""
    start, end = _literal(tokenizer, "<tool_call>"), _literal(tokenizer, "</tool_call>")
    return f'start: call{more}\ncall: {start} "\\n" obj "\\n" {end}\nobj: {_json_rule(call)}\n'


def _mistral_split(text: str) -> tuple[str, RawCalls] | None:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return None
    found = _json_prefix(text[at + len("[TOOL_CALLS]") :].lstrip())
    if found is None or not isinstance(found[0], list):
        return None
    calls = [c for c in found[0] if isinstance(c, dict)]
    if len(calls) != len(found[0]) or not calls:
        return None
    return text[:at].strip(), [(c.get("name"), c.get("arguments", {})) for c in calls]


def _mistral_grammar(functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
    call = _call_schema(functions, "arguments")
    array = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return f'start: {_literal(tokenizer, "[TOOL_CALLS]")} " " calls\ncalls: {_json_rule(array)}\n'


def _llama3_split(text: str) -> tuple[str, RawCalls] | None:
    body = text.removeprefix("<|python_tag|>").strip()
    found = _json_prefix(body) if body.startswith("{") else None
    if found is None or found[1] != len(body) or not isinstance(found[0], dict):
        return None
    call = found[0]
    if "name" not in call:
        return None
    return "", [(call["name"], call.get("parameters", call.get("arguments", {})))]


def _llama3_grammar(functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
    return f"start: obj\nobj: {_json_rule(_call_schema(functions, 'parameters'))}\n"


_HARMONY_CALL = re.compile(
    # the recipient before the channel (as gpt-oss's template renders calls) or after it (as
    # the model may write them), then any content type, then the arguments
    r"to=functions\.([\w.-]+)(?:[^<]|<\|channel\|>|<\|constrain\|>)*?<\|message\|>"
    r"(.*?)(?:<\|call\|>|$)",
    re.DOTALL,
)


def _harmony_split(text: str) -> tuple[str, RawCalls] | None:
    matches = list(_HARMONY_CALL.finditer(text))
    if not matches:
        return None
    calls = []
    for m in matches:
        try:
            calls.append((m.group(1), json.loads(m.group(2))))
        except json.JSONDecodeError:
            return None
    final = re.search(
        r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", text, re.DOTALL
    )
    return (final.group(1).strip() if final else ""), calls


def _harmony_grammar(functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
    """One call as gpt-oss writes it: ``<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>{...}<|call|>``. ``<|call|>`` ends the model's turn (it waits for the result), so a
    reply holds one call whatever ``parallel`` says. After an analysis message the engine writes
    the new message's ``<|start|>assistant`` before this grammar starts."""
    channel, constrain, message, call = (
        _literal(tokenizer, marker)
        for marker in ("<|channel|>", "<|constrain|>", "<|message|>", "<|call|>")
    )
    rules = ["start: " + " | ".join(f"call{i}" for i in range(len(functions)))]
    for i, (name, parameters) in enumerate(functions):
        header = json.dumps(f"commentary to=functions.{name} ")
        rules.append(f'call{i}: {channel} {header} {constrain} "json" {message} args{i} {call}')
        rules.append(f"args{i}: {_json_rule(parameters)}")
    return "\n".join(rules) + "\n"


# Detection order matters: the first row whose marker is in the chat template wins.
_FAMILIES: list[tuple[tuple[str, ...], ToolFormat]] = [
    (
        ("to=functions",),
        ToolFormat(
            "harmony",
            # after the analysis a new message starts; the recipient may precede the channel
            ("<|start|>", "<|channel|>", " to=functions."),
            _harmony_split,
            _harmony_grammar,
            own_channel=True,
        ),
    ),
    (
        ("[TOOL_CALLS]",),
        ToolFormat("mistral", ("[TOOL_CALLS]",), _mistral_split, _mistral_grammar),
    ),
    (
        ("<tool_call>",),
        ToolFormat("hermes", ("<tool_call>",), _hermes_split, _hermes_grammar),
    ),
    (
        ("<|python_tag|>", "Environment: ipython"),
        ToolFormat("llama3_json", (), _llama3_split, _llama3_grammar),
    ),
]


def detect_tool_format(tokenizer: Tokenizer) -> ToolFormat | None:
    """The tool-call format of a tokenizer's chat template, or None if no parser knows it."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    for markers, fmt in _FAMILIES:
        if any(m in template for m in markers):
            return fmt
    return None


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


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages ready for a template: assistant ``tool_calls`` with their arguments as
    objects (templates serialize them), tool results kept; ``ValueError`` on malformed ones."""
    out = []
    for i, message in enumerate(messages):
        where = f"chat message {i}"
        role, content = message.get("role"), message.get("content")
        calls = message.get("tool_calls")
        if not isinstance(role, str):
            raise ValueError(f"{where} must have a string 'role', got {message}")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise ValueError(f"{where}: only an assistant message has a list of tool_calls")
            message = dict(message, content=content or "", tool_calls=_history_calls(calls, where))
        elif not isinstance(content, (str, list)):  # a list: parts check_content_parts read
            raise ValueError(f"{where} must have string 'role' and 'content' fields, got {message}")
        if role == "tool" and not isinstance(message.get("tool_call_id", ""), str):
            raise ValueError(f"{where}: a tool result's tool_call_id must be a string")
        out.append(message)
    return out


def _history_calls(calls: list[Any], where: str) -> list[dict[str, Any]]:
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
        out.append(dict(call, function={"name": function["name"], "arguments": arguments}))
    return out
