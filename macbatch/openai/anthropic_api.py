"""Anthropic's Messages API (``POST /v1/messages``, what Claude Code speaks) as a shape over chat.

A Messages body is read as the chat body it means (``system`` -> a system message, content
blocks -> messages with ``tool_calls`` and ``role: tool`` results, ``input_schema`` tools -> chat
tools, ``tool_choice`` any/tool -> required/named, ``thinking`` -> the template's
``enable_thinking`` and ``budget_tokens`` -> ``thinking_token_budget``, ``stop_sequences`` ->
``stop``) and parsed by ``parse_chat``, so every field
means what it means to chat; errors name the Messages field. ``anthropic_output`` renders the
replies.
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

REFUSED = ("mcp_servers", "container")  # server-side features macbatch does not run
_SAMPLING = tuple(name for name in SAMPLING_FIELDS if name not in ("stop", "max_tokens"))
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_MEDIA = ("document", "search_result", "container_upload")


@dataclass(frozen=True)
class MessagesRequest:
    generation: Generation
    stop_sequences: tuple[str, ...]


def parse_messages(
    body: dict[str, Any],
    count_only: bool = False,
    keep_volatile: bool = False,
    images: ImageAccess = DATA_ONLY,
) -> MessagesRequest:
    """Validate a /v1/messages body (``count_only``: a count_tokens body, no ``max_tokens``;
    ``keep_volatile``: leave Claude Code's volatile lines in the prompt, ``volatile.py``)."""
    check_value(body)
    for name in REFUSED:
        if body.get(name):
            raise InvalidRequest(f"'{name}' is not supported by macbatch; leave it out", name)
    output = body.get("output_config")
    if isinstance(output, dict) and output.get("format") is not None:
        raise InvalidRequest(
            "'output_config.format' is not supported by macbatch yet; leave it out",
            "output_config",
        )
    chat: dict[str, Any] = {name: body[name] for name in (*_SAMPLING, "model") if name in body}
    messages = [*_system(body.get("system")), *anthropic_messages(body.get("messages"))]
    chat.update(messages=messages, stream=body.get("stream", False))
    if not count_only:
        if body.get("max_tokens") is None:
            raise InvalidRequest("'max_tokens' is required", "max_tokens")
        chat["max_tokens"] = body["max_tokens"]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise InvalidRequest("'stop_sequences' must be a list of strings", "stop_sequences")
        chat["stop"] = stops
    thinking = _thinking(body.get("thinking"))
    chat.update(_tools(body), **thinking)
    # chat field -> the Messages field the client sent it as (for error params)
    names = {"stop": "stop_sequences"}
    if "thinking_token_budget" in thinking:
        names["thinking_token_budget"] = "thinking.budget_tokens"
    try:
        generation = parse_chat(
            chat, volatile=None if keep_volatile else Shape.MESSAGES, images=images
        )
    except InvalidRequest as exc:
        if exc.param in names:
            name = names[exc.param]
            raise InvalidRequest(str(exc).replace(exc.param, name, 1), name) from None
        raise
    return MessagesRequest(generation, tuple(stops or ()))


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, list):
        value = _texts(value, "system")
    if not isinstance(value, str):
        raise InvalidRequest("'system' must be a string or a list of text blocks", "system")
    return [{"role": "system", "content": value}] if value else []


def anthropic_messages(value: Any) -> list[dict[str, Any]]:
    """User and assistant turns as chat messages: a user turn's ``tool_result`` blocks become
    ``role: tool`` messages (before its text), an assistant turn's ``tool_use`` blocks its
    ``tool_calls`` and its ``thinking`` its ``reasoning_content``."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'messages' must be a non-empty list of {role, content} objects", "messages"
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"{where}.role must be 'user' or 'assistant', got {role!r}", where)
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _blocks(role, content, where + ".content")
        else:
            raise InvalidRequest(f"{where}.content must be a string or a list of blocks", where)
    return out


def _image_url(block: dict[str, Any], at: str) -> str:
    """An image block's source as a URL: base64 data as a data URL, or the url itself."""
    given = block.get("source")
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = source.get("type")
    if kind == "base64":
        media = _string(source, "media_type", f"{at}.source")
        return f"data:{media};base64,{_string(source, 'data', f'{at}.source')}"
    if kind == "url":
        return _string(source, "url", f"{at}.source")
    raise InvalidRequest(f"{at}.source must be {{type: base64, ...}} or {{type: url, url}}", at)


def _blocks(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts, results, calls, thinking = [], [], [], []
    parts: list[dict[str, Any]] = []  # a user turn's text and images in order (chat parts)
    allowed = (
        ("text", "tool_result", "image") if role == "user" else ("text", "tool_use", "thinking")
    )
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted by Anthropic: nothing a local template can render
        if kind in _MEDIA:
            raise InvalidRequest(
                f"{at}: '{kind}' blocks are not supported: macbatch serves the text model", at
            )
        if kind not in allowed:
            raise InvalidRequest(
                f"{at}: a {role} turn takes {', '.join(allowed)} blocks, got {kind!r}", at
            )
        if kind == "text":
            texts.append(_string(block, "text", at))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", at))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise InvalidRequest(f"{at}.input must be an object", at)
            function = {"name": _string(block, "name", at), "arguments": arguments}
            calls.append({"id": _string(block, "id", at), "type": "function", "function": function})
        else:
            results.append(_result(block, at))
    if role == "user":
        content: str | list[dict[str, Any]] = "".join(texts)
        if len(parts) > len(texts):  # images: the chat layer reads and checks them
            content = parts
        return [*results, *([{"role": "user", "content": content}] if parts else [])]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return [message]


def _result(block: dict[str, Any], at: str) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        content = _texts(content, at + ".content")
    if not isinstance(content, str):
        raise InvalidRequest(f"{at}.content must be a string or a list of text blocks", at)
    return {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": content}


def _texts(blocks: list[Any], where: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise InvalidRequest(
                f"{where}[{j}]: only text blocks are supported, got {kind!r}", where
            )
        texts.append(_string(block, "text", f"{where}[{j}]"))
    return "".join(texts)


def _string(block: dict[str, Any], key: str, at: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{at}.{key} must be a string", at)
    return value


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {"tools": converted_tools(body.get("tools"), _tool)}
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool" and isinstance(choice.get("name"), str):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind in _CHOICES:
            chat["tool_choice"] = _CHOICES[kind]
        else:
            raise InvalidRequest(
                "tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', "
                "'name': ...}",
                "tool_choice",
            )
        if choice.get("disable_parallel_tool_use") is not None:
            chat["parallel_tool_calls"] = not choice["disable_parallel_tool_use"]
    return chat


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type", "custom") if isinstance(tool, dict) else None
    if kind != "custom":
        raise InvalidRequest(
            f"{where}: only client tools ({{name, description, input_schema}}) are supported "
            f"(macbatch runs no server tools), got type {kind!r}",
            "tools",
        )
    function = {k: tool[k] for k in ("name", "description") if k in tool}
    if "input_schema" in tool:
        function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def _thinking(value: Any) -> dict[str, Any]:
    """``thinking`` -> the chat template's ``enable_thinking`` (absent: the template's default),
    and an enabled block's ``budget_tokens`` -> ``thinking_token_budget`` (an integer >= 0, its
    ceiling SamplingParams'; Anthropic's floor of 1024 is its models', not a local one's)."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "disabled"):
        raise InvalidRequest(
            "thinking must be {'type': 'enabled', 'budget_tokens': ...} or {'type': 'disabled'}",
            "thinking",
        )
    chat: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": kind == "enabled"}}
    budget = value.get("budget_tokens")
    if kind == "enabled" and budget is not None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise InvalidRequest(
                "'thinking.budget_tokens' must be an integer >= 0", "thinking.budget_tokens"
            )
        chat["thinking_token_budget"] = budget
    return chat
