"""OpenAI's Responses API (``POST /v1/responses``, what Codex CLI speaks) as a shape over chat.

A Responses body is read as the chat body it means (``input`` items -> messages,
``instructions`` -> a system message, flat function tools -> chat tools, ``text.format`` ->
``response_format``, ``reasoning.effort`` -> the template's ``reasoning_effort`` and a thinking
budget (``EFFORT_BUDGETS``),
``max_output_tokens`` -> ``max_tokens``) and parsed by ``parse_chat``, so every field means what it
means to chat; errors name the Responses field. ``responses_output`` turns the engine outputs into
the ``response`` object and its stream events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macbatch.openai.bodies import check_value
from macbatch.openai.errors import InvalidRequest
from macbatch.openai.image_parts import DATA_ONLY, ImageAccess
from macbatch.openai.options import converted_tools
from macbatch.openai.requests import Generation, parse_chat
from macbatch.openai.sampling import SAMPLING_FIELDS
from macbatch.openai.volatile import Shape

# Responses fields macbatch cannot honour: refused with a 400 rather than dropped
REFUSED = ("background", "conversation", "prompt")
# chat field -> the Responses field a client sent it as (for error params)
_RESPONSES_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses body, read: the chat generation, the conversation it continues with its new
    input (without ``instructions``, which a follow-up does not inherit), and what the response
    object echoes back."""

    generation: Generation
    conversation: list[dict[str, Any]]
    echo: dict[str, Any]
    store: bool
    previous_response_id: str | None


def previous_response_id(body: dict[str, Any]) -> str | None:
    value = body.get("previous_response_id")
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("'previous_response_id' must be a string", "previous_response_id")
    return value


def parse_responses(
    body: dict[str, Any],
    history: list[dict[str, Any]] | None = None,
    keep_volatile: bool = False,
    images: ImageAccess = DATA_ONLY,
) -> ResponsesRequest:
    """Validate a /v1/responses body; ``history``: the stored conversation of
    ``previous_response_id`` (the caller looks it up: a missing one is a 404);
    ``keep_volatile``: leave agent clients' volatile prompt lines in, ``volatile.py``."""
    check_value(body)  # the response echoes some of it (metadata, tools): valid text only
    for name in REFUSED:
        if body.get(name):
            raise InvalidRequest(f"'{name}' is not supported by macbatch; leave it out", name)
    conversation = [*(history or []), *input_messages(body.get("input"))]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat = {name: body[name] for name in (*SAMPLING_FIELDS, "model") if name in body}
    chat.update(messages=[*system, *conversation], stream=body.get("stream", False))
    chat.update(_tools(body), **_format(body.get("text")))
    chat = {**_effort(body.get("reasoning")), **chat}  # a body's own thinking_token_budget wins
    chat["max_tokens"] = body.get("max_output_tokens")
    try:
        generation = parse_chat(
            chat, volatile=None if keep_volatile else Shape.RESPONSES, images=images
        )
    except InvalidRequest as exc:
        raise _renamed(exc) from None
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise InvalidRequest("'metadata' must be an object of strings", "metadata")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise InvalidRequest("'store' must be true or false", "store")
    echo = {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": chat.get("parallel_tool_calls", True),
        "reasoning": {"effort": chat.get("reasoning_effort"), "summary": None},
        "temperature": generation.params.temperature,
        "top_p": generation.params.top_p,
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "metadata": metadata or {},
    }
    previous = previous_response_id(body)
    return ResponsesRequest(generation, conversation, echo, store, previous)


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input``: a string (one user message) or a list of items (messages, ``function_call``,
    ``function_call_output``; ``reasoning`` items are accepted and left out, as chat templates
    drop earlier turns' reasoning), as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _call(messages, item, where)
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = _text(output, where + ".output")
            if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
                raise InvalidRequest(
                    f"{where}: a function_call_output needs a string 'call_id' and 'output'", where
                )
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind != "reasoning":
            raise InvalidRequest(
                f"{where}: items of type {kind!r} are not supported; send messages, "
                "function_call and function_call_output items",
                where,
            )
    if not messages:
        raise InvalidRequest("'input' holds no message", "input")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"{where}.role must be one of {', '.join(_ROLES)}; got {role!r}", where
        )
    content = item.get("content")
    if isinstance(content, list):
        content = _parts(content, where + ".content")
    if not isinstance(content, (str, list)):
        raise InvalidRequest(f"{where}.content must be a string or a list of parts", where)
    return {"role": "system" if role == "developer" else role, "content": content}


def _parts(parts: list[Any], where: str) -> str | list[dict[str, Any]]:
    """Text parts joined; with ``input_image`` parts, chat parts in order (``image_url`` parts,
    which the chat layer reads and checks as it does serve's)."""
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return _text(parts, where)
    out = []
    for i, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise InvalidRequest(
                    f"{where}[{i}]: an input_image part needs image_url (a data: URL, a file:// "
                    "path or an http(s) URL); file_id is not supported",
                    where,
                )
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            out.append({"type": "text", "text": _text([part], f"{where}[{i}]")})
    return out


def _text(parts: list[Any], where: str) -> str:
    """Text parts (``input_text``, ``output_text``) joined; images and files are refused."""
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"{where}: only text parts (input_text, output_text) and input_image parts "
                f"(in messages) are supported, got {kind!r}",
                where,
            )
        texts.append(part["text"])
    return "".join(texts)


def _call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A ``function_call`` item joins the assistant turn it follows (or starts one)."""
    name, arguments, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
    if not all(isinstance(v, str) for v in (name, arguments, call_id)):
        raise InvalidRequest(
            f"{where}: a function_call needs string 'call_id', 'name' and 'arguments'", where
        )
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    messages[-1].setdefault("tool_calls", []).append(call)


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """Flat function tools (``{type, name, description, parameters}``) in chat's shape."""
    chat: dict[str, Any] = {"tools": converted_tools(body.get("tools"), _tool)}
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InvalidRequest(
                "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                "'name': ...}",
                "tool_choice",
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        chat["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    return chat


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise InvalidRequest(
            f"{where}: only function tools are supported (macbatch runs no hosted tools), "
            f"got {kind!r}",
            "tools",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _format(text: Any) -> dict[str, Any]:
    """``text.format`` as chat's ``response_format``."""
    if text is None:
        return {}
    if not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return {}
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"response_format": {"type": "json_schema", "json_schema": spec}}
    return {"response_format": fmt}


# ``reasoning.effort`` -> a thinking budget (tokens of reasoning before the engine closes the
# block); an effort not listed sets the template's variable only.
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384}


def _effort(reasoning: Any) -> dict[str, Any]:
    """``reasoning.effort`` -> the template's ``reasoning_effort`` (gpt-oss reads it) and the
    budget ``EFFORT_BUDGETS`` gives it."""
    if reasoning is None:
        return {}
    if not isinstance(reasoning, dict):
        raise InvalidRequest("'reasoning' must be an object", "reasoning")
    effort = reasoning.get("effort")
    if effort is None:
        return {}
    chat: dict[str, Any] = {"reasoning_effort": effort}
    if isinstance(effort, str) and effort in EFFORT_BUDGETS:
        chat["thinking_token_budget"] = EFFORT_BUDGETS[effort]
    return chat


def _renamed(exc: InvalidRequest) -> InvalidRequest:
    """A chat parser's error, naming the Responses field the client sent."""
    param = exc.param or ""
    head, dot, rest = param.partition(".")
    base, bracket, index = head.partition("[")
    if base in _RESPONSES_NAMES:
        name = _RESPONSES_NAMES[base] + bracket + index + dot + rest
        message = str(exc).replace(f"'{base}'", f"'{_RESPONSES_NAMES[base]}'")
        return InvalidRequest(message, name)
    return exc
