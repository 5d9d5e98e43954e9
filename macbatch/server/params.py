"""Request bodies -> engine work: validated prompts and SamplingParams, under OpenAI's field names.

Unknown fields are ignored, as OpenAI clients expect (they send extras such as ``user``). Known
fields this server cannot honour (``echo``, ``functions`` ...) are refused with a 400 rather than
silently dropped, unless they hold their neutral value. Structured output and tools are read by
``macbatch.engine.request_options``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from macbatch.engine import (
    InvalidSamplingParam,
    SamplingParams,
    StructuredOutput,
    check_chat_template_kwargs,
)
from macbatch.engine.request_options import (
    InvalidField,
    ToolRequest,
    constraint,
    structured_output,
)
from macbatch.engine.tool_calls import ToolFormat
from macbatch.server.errors import invalid

Prompt = str | list[int] | list[dict[str, Any]]

# OpenAI's defaults: chat replies may fill the context (None), completions stop at 16 tokens.
DEFAULT_MAX_TOKENS = {"chat": None, "completion": 16}
MAX_CHOICES = 64  # engine requests one HTTP request may start (prompts x n)
MAX_STOP = 16
_OPENAI_NAMES = {"logprobs": "top_logprobs"}  # engine field -> request field, where they differ
_MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "video_url", "file")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_NUMBER = (int, float)
_EFFORTS = ("minimal", "low", "medium", "high")
# message fields the template needs besides role and content (the engine checks their shape)
_TOOL_FIELDS = ("tool_calls", "tool_call_id", "name", "reasoning_content")


@dataclass(frozen=True)
class Generation:
    """One HTTP request's work: engine requests (choice index = position) and how to answer."""

    jobs: tuple[tuple[Prompt, SamplingParams], ...]
    n: int  # choices per prompt
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs; k: the chosen token's and k alternatives
    model: str | None
    chat_template_kwargs: dict[str, Any] | None = None  # chat only: the template's variables
    tools: ToolRequest | None = None


def parse_chat(
    body: dict[str, Any], tool_format: ToolFormat | None = None, tokenizer: Any = None
) -> Generation:
    """Validate a /v1/chat/completions body (``tool_format``: the model's, for tools)."""
    _refuse_unsupported(body, ("functions", "logit_bias", "audio"))
    messages = _messages(body.get("messages"))
    structured, tools = _options(body, tool_format, tokenizer)
    top_logprobs = None
    if _get(body, "logprobs", (bool,), False, "true or false"):
        top_logprobs = _get(body, "top_logprobs", (int,), 0, "an integer in [0, 20]")
    elif body.get("top_logprobs") is not None:
        raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    max_tokens = _get(body, "max_completion_tokens", (int,), None, "an integer >= 1")
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", (int,), DEFAULT_MAX_TOKENS["chat"], "an integer >= 1")
    generation = _generation(body, [messages], max_tokens, top_logprobs, structured)
    return dataclasses.replace(generation, tools=tools, chat_template_kwargs=_template_kwargs(body))


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """``chat_template_kwargs`` (as vLLM and mlx-lm's server take it), plus ``reasoning_effort``
    (OpenAI's field; gpt-oss's template reads the variable of that name)."""
    try:
        kwargs = check_chat_template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as exc:
        raise invalid(str(exc), "chat_template_kwargs") from None
    effort = _get(body, "reasoning_effort", (str,), None, "one of " + ", ".join(_EFFORTS))
    if effort is not None:
        if effort not in _EFFORTS:
            raise invalid(
                f"'reasoning_effort' must be one of {', '.join(_EFFORTS)}, got {effort!r}",
                "reasoning_effort",
            )
        kwargs.setdefault("reasoning_effort", effort)
    return kwargs or None


def parse_completion(body: dict[str, Any]) -> Generation:
    """Validate a /v1/completions body (prompt: a text, token ids, or a list of either)."""
    _refuse_unsupported(body, ("logit_bias", "suffix"))
    if _get(body, "echo", (bool,), False, "true or false"):
        raise invalid("'echo' is not supported by macbatch serve", "echo")
    best_of = _get(body, "best_of", (int,), 1, "an integer")
    if best_of != 1 and best_of != body.get("n", 1):
        raise invalid("'best_of' other than n is not supported by macbatch serve", "best_of")
    top_logprobs = _get(body, "logprobs", (int,), None, "an integer in [0, 20]")
    max_tokens = _get(
        body, "max_tokens", (int,), DEFAULT_MAX_TOKENS["completion"], "an integer >= 1"
    )
    prompts = _prompts(body.get("prompt"))
    try:
        structured = structured_output(body)
    except InvalidField as exc:
        raise invalid(str(exc), exc.field) from None
    return _generation(body, prompts, max_tokens, top_logprobs, structured)


def _options(
    body: dict[str, Any], tool_format: ToolFormat | None, tokenizer: Any
) -> tuple[StructuredOutput | None, ToolRequest | None]:
    try:
        return constraint(body, tool_format, tokenizer)
    except InvalidField as exc:
        raise invalid(str(exc), exc.field) from None


def _generation(
    body: dict[str, Any],
    prompts: list[Prompt],
    max_tokens: int,
    top_logprobs: int | None,
    structured: StructuredOutput | None,
) -> Generation:
    n = _get(body, "n", (int,), 1, "an integer >= 1")
    if n < 1 or n * len(prompts) > MAX_CHOICES:
        raise invalid(f"'n' times the number of prompts must be in [1, {MAX_CHOICES}]", "n")
    if top_logprobs is not None and not 0 <= top_logprobs <= 20:
        raise invalid(f"logprobs must ask for 0 to 20 alternatives, got {top_logprobs}", "logprobs")
    seed = _get(body, "seed", (int,), None, "an integer")
    top_k = _get(body, "top_k", (int,), 0, "an integer (0 or -1 means off)")
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_get(body, "temperature", _NUMBER, 1.0, "a number in [0, 2]"),
            top_p=_get(body, "top_p", _NUMBER, 1.0, "a number in (0, 1]"),
            top_k=0 if top_k == -1 else top_k,
            min_p=_get(body, "min_p", _NUMBER, 0.0, "a number in [0, 1)"),
            repetition_penalty=_get(body, "repetition_penalty", _NUMBER, 1.0, "a number > 0"),
            presence_penalty=_get(body, "presence_penalty", _NUMBER, 0.0, "a number in [-2, 2]"),
            frequency_penalty=_get(body, "frequency_penalty", _NUMBER, 0.0, "a number in [-2, 2]"),
            seed=seed,
            stop=_stop(body.get("stop")),
            logprobs=top_logprobs,
            structured=structured,
        )
    except InvalidSamplingParam as exc:
        raise invalid(str(exc), _OPENAI_NAMES.get(exc.field, exc.field)) from None
    jobs = tuple(
        (prompt, params if seed is None else dataclasses.replace(params, seed=seed + i))
        for prompt in prompts
        for i in range(n)
    )
    stream = _get(body, "stream", (bool,), False, "true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    include_usage = stream and _get(options, "include_usage", (bool,), False, "true or false")
    model = _get(body, "model", (str,), None, "a string")
    return Generation(jobs, n, stream, include_usage, top_logprobs, model)


def _get(
    body: dict[str, Any], name: str, types: tuple[type, ...], default: Any, expected: str
) -> Any:
    """``body[name]`` if it has one of ``types`` (null means absent; True is not a number)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise invalid(f"'{name}' must be {expected}, got {value!r}", name)
    return value


def _refuse_unsupported(body: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if body.get(name):
            raise invalid(f"'{name}' is not supported by macbatch serve; leave it out", name)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise invalid(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", "stop"
        )
    return tuple(stops)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty list of {role, content} objects", "messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object with 'role' and 'content'", where)
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(_ROLES)}; got {role!r}", where)
        content = _content(message.get("content"), where)
        kept = {k: message[k] for k in _TOOL_FIELDS if message.get(k) is not None}
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": content, **kept})
    return messages


def _content(value: Any, where: str) -> str:
    """Message content: a string, or a list of text parts (joined); other parts are refused."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _MEDIA_PARTS:
                raise invalid(
                    f"{where}.content: '{kind}' parts are not supported: macbatch serves the text "
                    "model of multimodal checkpoints; send text parts only",
                    where,
                )
            if kind != "text":
                raise invalid(f"{where}.content: only text parts are supported", where)
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content: a text part needs a string 'text'", where)
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"{where}.content must be a string or a list of text parts", where)


def _prompts(value: Any) -> list[Prompt]:
    """A completion prompt: text, token ids, or a non-empty list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return [value]
        if all(isinstance(p, str) for p in value):
            return list(value)
        if all(
            isinstance(p, list)
            and p
            and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in value
        ):
            return list(value)
    raise invalid(
        "'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt"
    )
