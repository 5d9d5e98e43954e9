"""Structured output and tools as request fields, in the names clients already send: OpenAI's
``response_format``, ``tools``, ``tool_choice`` and ``parallel_tool_calls``, and vLLM's extras
(``structured_outputs``, ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar``), turned into the engine's ``StructuredOutput``. Part of the one request layer
(``macbatch.openai``): serve's bodies, run's OpenAI-batch rows and job settings all come here; every
mistake is an ``InvalidRequest`` naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from macbatch.engine import StructuredOutput, Tokenizer, ToolFormat, check_tools, chosen_tools
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


# What reaches llguidance is bounded: it compiles recursively, and a $ref chain 1,000 definitions
# deep or a chain of 3,000 grammar rules overflowed an 8 MB stack and killed the process (a
# segfault no exception handler sees; 800 and 2,500 passed). The engine compiles on a thread with
# a 256 MB stack (engine/structured_output/constraints.py); these bounds keep ~100x below what that
# stack holds, and
# far above real schemas (a 22,000-line OpenAPI-style one with 400 definitions nests 156 deep).
MAX_SCHEMA_DEPTH = 512  # objects and arrays inside each other, each $ref entering what it names
MAX_SCHEMA_DEFINITIONS = 5_000  # entries of $defs / definitions, all together
MAX_GRAMMAR_RULES = 1_000
MAX_GRAMMAR_BYTES = 256 * 1024
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.]*(?:\.-?\d+)?[ \t]*(?::|::=)", re.MULTILINE)


def invalid(message: str, field: str) -> InvalidRequest:
    return InvalidRequest(message, field)


def check_schema_size(schema: dict[str, Any], where: str) -> None:
    """``InvalidRequest`` if ``schema`` nests past ``MAX_SCHEMA_DEPTH`` (following its local
    ``$ref``s: a recursive schema is fine, a chain of definitions counts in full) or has more
    than ``MAX_SCHEMA_DEFINITIONS`` definitions."""
    depth, definitions = _schema_extent(schema)
    if definitions > MAX_SCHEMA_DEFINITIONS:
        raise invalid(
            f"{where}: the schema has {definitions:,} definitions; macbatch accepts at most "
            f"{MAX_SCHEMA_DEFINITIONS:,}",
            where,
        )
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid(
            f"{where}: the schema nests more than {MAX_SCHEMA_DEPTH} levels deep (objects and "
            "arrays inside each other, each $ref counted as the schema it names); macbatch "
            f"accepts at most {MAX_SCHEMA_DEPTH}: flatten the chain of definitions",
            where,
        )


def check_grammar_size(grammar: str, where: str) -> None:
    """``InvalidRequest`` for a grammar past ``MAX_GRAMMAR_BYTES`` or ``MAX_GRAMMAR_RULES``."""
    size = len(grammar.encode("utf-8", "replace"))
    if size > MAX_GRAMMAR_BYTES:
        raise invalid(
            f"{where}: the grammar is {size:,} bytes; macbatch accepts at most "
            f"{MAX_GRAMMAR_BYTES:,}",
            where,
        )
    rules = len(_RULE.findall(grammar))
    if rules > MAX_GRAMMAR_RULES:
        raise invalid(
            f"{where}: the grammar has {rules:,} rules; macbatch accepts at most "
            f"{MAX_GRAMMAR_RULES:,}",
            where,
        )


def _schema_extent(schema: dict[str, Any]) -> tuple[int, int]:
    """(the deepest nesting, following local ``$ref``s; the number of definitions).

    Each part of the schema a ``$ref`` can name is walked once, without following refs: its own
    depth and, per ref in it, the depth the ref sits at. The longest path through those refs is
    then found without recursion (a ref back to a part on the path is recursion, which
    llguidance compiles lazily, so it adds nothing)."""
    parts: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    definitions = 0
    pending = ["#"]
    while pending:
        pointer = pending.pop()
        if pointer in parts:
            continue
        node = _resolve(schema, pointer)
        local, refs, found = _walk(node)
        definitions += found if pointer == "#" else 0
        parts[pointer] = (local, refs)
        pending.extend(target for _, target in refs if target not in parts)
    best: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[str, bool]] = [("#", False)]
    while stack:
        pointer, expanded = stack.pop()
        local, refs = parts[pointer]
        if expanded:
            on_path.discard(pointer)
            below = [at + best.get(t, 0) for at, t in refs if t in parts and t not in on_path]
            best[pointer] = max([local, *below])
            continue
        if pointer in best or pointer in on_path:
            continue
        on_path.add(pointer)
        stack.append((pointer, True))
        stack.extend((t, False) for _, t in refs if t in parts and t not in best)
    return best["#"], definitions


def _walk(node: Any) -> tuple[int, list[tuple[int, str]], int]:
    """(depth of ``node``, (depth, pointer) of each local $ref in it, definitions in it)."""
    deepest, refs, definitions = 0, [], 0
    stack: list[tuple[Any, int]] = [(node, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.append((depth, ref))
            for key, child in item.items():
                if key in ("$defs", "definitions") and isinstance(child, dict):
                    definitions += len(child)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest, refs, definitions


def _resolve(schema: dict[str, Any], pointer: str) -> Any:
    """The part of ``schema`` a local JSON pointer names (None if it names nothing)."""
    node: Any = schema
    for raw in pointer[1:].lstrip("/").split("/") if pointer != "#" else ():
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


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
    schema = fields.get("json_schema")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError):
            schema = None  # StructuredOutput says what is wrong with it
    if isinstance(schema, dict):
        check_schema_size(schema, where)
    if isinstance(fields.get("grammar"), str):
        check_grammar_size(fields["grammar"], where)
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
    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is not None:
            check_schema_size(parameters, f"tools[{i}].function.parameters")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise invalid("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    try:
        forced = chosen_tools(tools, choice)
    except ValueError as exc:
        raise invalid(str(exc), "tool_choice") from None
    return ToolRequest(tools, choice, forced, parallel)


def converted_tools(
    value: Any, convert: Callable[[Any, str], dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """Another API's ``tools`` (Responses', Anthropic's) in chat's shape: ``convert`` takes one
    tool and where it is (``tools[3]``); None when there are none."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("'tools' must be a list of tools", "tools")
    return [convert(tool, f"tools[{i}]") for i, tool in enumerate(value)] or None


def bind_tools(
    request: ToolRequest, tool_format: ToolFormat | None, tokenizer: Tokenizer
) -> BoundTools:
    """What the model makes of the request: a forced choice needs a format macbatch can parse
    (and becomes a grammar); "auto" without one shows the tools and leaves the reply text."""
    if tool_format is not None:
        tool_format = tool_format.for_tools(request.tools)  # argument values typed by schema
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
