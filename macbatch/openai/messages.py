"""Prompts in a request body: chat ``messages`` and legacy ``prompt``s, checked and normalized
the same way for every front end (serve's bodies, run's OpenAI-batch rows and job prompts)."""

from __future__ import annotations

from typing import Any

from macbatch.openai.errors import InvalidRequest
from macbatch.openai.image_parts import DATA_ONLY, ImageAccess, image_part

ROLES = ("system", "developer", "user", "assistant", "tool")
_MEDIA_PARTS = ("input_image", "image", "input_audio", "audio", "video_url", "file")
# message fields the template needs besides role and content (the engine checks their shape)
_TOOL_FIELDS = ("tool_calls", "tool_call_id", "name", "reasoning_content")

CompletionPrompt = str | list[int]


def chat_messages(value: Any, images: ImageAccess = DATA_ONLY) -> list[dict[str, Any]]:
    """Messages with a known role (``developer`` read as ``system``, as OpenAI does for models
    without it) and text content (a list of text parts joined), or text and image parts (read
    where ``images`` allows)."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "'messages' must be a non-empty list of {role, content} objects", "messages"
        )
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object with 'role' and 'content'", where)
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", where
            )
        if message.get("content") is None and role != "assistant":
            # only an assistant turn may go without (one that just called tools)
            raise InvalidRequest(f"{where}.content must be a string or a list of text parts", where)
        content = _content(message.get("content"), where, images)
        kept = {k: message[k] for k in _TOOL_FIELDS if message.get(k) is not None}
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": content, **kept})
    return messages


def _content(value: Any, where: str, images: ImageAccess) -> str | list[dict[str, Any]]:
    """Message content: a string, or a list of parts: text parts are joined into a string when
    there is no image; with images, a list of text and ``{"type": "image", "image": Image}``
    parts in order (the form multimodal chat templates read). Other parts are refused."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of parts", where)
    parts = [_part(part, f"{where}.content[{i}]", images) for i, part in enumerate(value)]
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _part(part: Any, where: str, images: ImageAccess) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image_url":
        return {"type": "image", "image": image_part(part, where, images)}
    if kind in _MEDIA_PARTS:
        raise InvalidRequest(
            f"{where}: '{kind}' parts are not supported; images go in 'image_url' parts", where
        )
    if kind != "text":
        raise InvalidRequest(f"{where}: only text and image_url parts are supported", where)
    if not isinstance(part.get("text"), str):
        raise InvalidRequest(f"{where}: a text part needs a string 'text'", where)
    return {"type": "text", "text": part["text"]}


def completion_prompts(value: Any) -> list[CompletionPrompt]:
    """A completion prompt: text, token ids, or a non-empty list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(_is_token(t) for t in value):
            return [value]
        if all(isinstance(p, str) for p in value):
            return list(value)
        if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in value):
            return list(value)
    raise InvalidRequest(
        "'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt"
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
