"""OpenAI request bodies -> engine work: the one parser every front end uses.

``parse_chat`` and ``parse_completion`` read a body with nothing but the body (and the front
end's ``Defaults``); ``Generation.bind`` then checks it against the model (tools need its
tool-call format) and yields one ``(PromptInput, SamplingParams)`` per choice. ``serve`` parses
HTTP bodies, ``run`` its OpenAI-batch rows and (as bodies it builds) its job prompts, so the same
body gives the same engine requests and the same reply whichever received it.

Unknown fields are ignored, as OpenAI clients expect (they send extras such as ``user``). Known
fields macbatch cannot honour (``echo``, ``functions``, ``logit_bias`` ...) are refused rather
than silently dropped, unless they hold their neutral value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from macbatch.engine import (
    MAX_LOGPROBS,
    InvalidSamplingParam,
    Prompt,
    PromptInput,
    SamplingParams,
    StructuredOutput,
    Tokenizer,
    ToolFormat,
    check_chat_template_kwargs,
)
from macbatch.openai.bodies import check_value
from macbatch.openai.errors import InvalidRequest
from macbatch.openai.image_parts import DATA_ONLY, ImageAccess
from macbatch.openai.messages import chat_messages, completion_prompts
from macbatch.openai.options import ToolRequest, bind_tools, structured_output, tool_request
from macbatch.openai.sampling import OPENAI_CHAT, OPENAI_COMPLETION, Defaults, sampling_params
from macbatch.openai.volatile import Shape, stable_messages

MAX_CHOICES = 64  # engine requests one body may start (prompts x n)
_EFFORTS = ("minimal", "low", "medium", "high")


class Endpoint(str, Enum):
    CHAT = "/v1/chat/completions"
    COMPLETION = "/v1/completions"


@dataclass(frozen=True)
class Bound:
    """A generation checked against the model: the engine requests (choice index = position)
    and the tool-call format to read the replies with (None: replies are all text)."""

    requests: tuple[tuple[PromptInput, SamplingParams], ...]
    parse_with: ToolFormat | None


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The sampling of ``n`` choices (or a job's samples), in order: choice i with seed + i;
    ``InvalidRequest`` if a choice's seed passes the seeds' range."""
    seed = params.seed
    if seed is None:
        return [params] * n
    try:
        return [dataclasses.replace(params, seed=seed + i) for i in range(n)]
    except InvalidSamplingParam as exc:
        room = f"'seed' must leave room for {n} choices (choice i samples with seed + i)"
        raise InvalidRequest(f"{room}: {exc}", "seed") from None


@dataclass(frozen=True)
class Generation:
    """One body's work, read from the body alone."""

    endpoint: Endpoint
    prompts: tuple[Prompt, ...]
    params: SamplingParams  # choice i of a seeded body samples with seed + i
    n: int  # choices per prompt
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs; k: the chosen token's and k alternatives
    model: str | None
    chat_template_kwargs: dict[str, Any] | None = None  # chat only: the template's variables
    tools: ToolRequest | None = None

    def choice_params(self) -> list[SamplingParams]:
        """The sampling of each choice of one prompt, in choice order (``choice_params``)."""
        return choice_params(self.params, self.n)

    def bind(self, tool_format: ToolFormat | None, tokenizer: Tokenizer) -> Bound:
        """The engine requests; ``InvalidRequest`` if the model cannot honour the tools."""
        tools = None if self.tools is None else bind_tools(self.tools, tool_format, tokenizer)
        params = self.choice_params()
        if tools is not None and tools.constraint is not None:
            params = [dataclasses.replace(p, structured=tools.constraint) for p in params]
        kwargs = self.chat_template_kwargs
        tool_list = None if tools is None else tools.tools
        requests = tuple(
            (PromptInput(prompt, kwargs, tool_list), choice)
            for prompt in self.prompts
            for choice in params
        )
        return Bound(requests, None if tools is None else tools.parse_with)


def parse_chat(
    body: dict[str, Any],
    defaults: Defaults = OPENAI_CHAT,
    volatile: Shape | None = Shape.CHAT,
    images: ImageAccess = DATA_ONLY,
) -> Generation:
    """Validate a /v1/chat/completions body; the volatile lines of agent clients sending the
    API shape ``volatile`` are taken out of its prompt (``volatile.py``; None: kept); image
    parts are read where ``images`` allows (``image_parts.py``)."""
    check_value(body)
    _refuse_unsupported(body, ("functions", "logit_bias", "audio"))
    messages = chat_messages(body.get("messages"), images)
    if volatile is not None:
        messages = stable_messages(messages, volatile)
    tools = tool_request(body)
    structured = structured_output(body)
    if structured is not None and tools is not None and tools.forced is not None:
        raise InvalidRequest(
            "a forced tool_choice and a response_format cannot both constrain one reply",
            "tool_choice",
        )
    top_logprobs = None
    if _get(body, "logprobs", (bool,), False, "true or false"):
        top_logprobs = _logprobs(body, "top_logprobs", 0)
    elif body.get("top_logprobs") is not None:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    generation = _generation(body, Endpoint.CHAT, [messages], defaults, top_logprobs, structured)
    return dataclasses.replace(generation, tools=tools, chat_template_kwargs=_template_kwargs(body))


def parse_completion(body: dict[str, Any], defaults: Defaults = OPENAI_COMPLETION) -> Generation:
    """Validate a /v1/completions body (prompt: a text, token ids, or a list of either)."""
    check_value(body)
    _refuse_unsupported(body, ("logit_bias", "suffix"))
    if body.get("messages") is not None:
        raise InvalidRequest(
            "/v1/completions takes 'prompt', not 'messages'; send chat messages to "
            "/v1/chat/completions",
            "messages",
        )
    if _get(body, "echo", (bool,), False, "true or false"):
        raise InvalidRequest("'echo' is not supported by macbatch", "echo")
    best_of = _get(body, "best_of", (int,), 1, "an integer")
    if best_of != 1 and best_of != body.get("n", 1):
        raise InvalidRequest("'best_of' other than n is not supported by macbatch", "best_of")
    top_logprobs = _logprobs(body, "logprobs", None)
    prompts = completion_prompts(body.get("prompt"))
    structured = structured_output(body)
    return _generation(body, Endpoint.COMPLETION, prompts, defaults, top_logprobs, structured)


def parse_body(
    endpoint: Endpoint,
    body: dict[str, Any],
    defaults: Defaults | None = None,
    keep_volatile: bool = False,
    images: ImageAccess = DATA_ONLY,
) -> Generation:
    """Either endpoint's body (``defaults``: the endpoint's OpenAI defaults when None;
    ``keep_volatile``: leave agent clients' volatile prompt lines in, ``volatile.py``;
    ``images``: where image parts may come from)."""
    if endpoint is Endpoint.CHAT:
        volatile = None if keep_volatile else Shape.CHAT
        return parse_chat(body, defaults or OPENAI_CHAT, volatile, images)
    return parse_completion(body, defaults or OPENAI_COMPLETION)


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """``chat_template_kwargs`` (as vLLM and mlx-lm's server take it), plus ``reasoning_effort``
    (OpenAI's field; gpt-oss's template reads the variable of that name)."""
    try:
        kwargs = check_chat_template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as exc:
        raise InvalidRequest(str(exc), "chat_template_kwargs") from None
    effort = _get(body, "reasoning_effort", (str,), None, "one of " + ", ".join(_EFFORTS))
    if effort is not None:
        if effort not in _EFFORTS:
            raise InvalidRequest(
                f"'reasoning_effort' must be one of {', '.join(_EFFORTS)}, got {effort!r}",
                "reasoning_effort",
            )
        kwargs.setdefault("reasoning_effort", effort)
    return kwargs or None


def _generation(
    body: dict[str, Any],
    endpoint: Endpoint,
    prompts: list[Any],
    defaults: Defaults,
    top_logprobs: int | None,
    structured: StructuredOutput | None,
) -> Generation:
    n = _get(body, "n", (int,), 1, "an integer >= 1")
    if n < 1 or n * len(prompts) > MAX_CHOICES:
        raise InvalidRequest(f"'n' times the number of prompts must be in [1, {MAX_CHOICES}]", "n")
    params = sampling_params(body, defaults, top_logprobs)
    stream = _get(body, "stream", (bool,), False, "true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", "stream_options")
    include_usage = stream and _get(options, "include_usage", (bool,), False, "true or false")
    model = _get(body, "model", (str,), None, "a string")
    params = dataclasses.replace(params, structured=structured)
    generation = Generation(
        endpoint, tuple(prompts), params, n, stream, include_usage, top_logprobs, model
    )
    generation.choice_params()  # every choice's seed in range: refused here, not at bind
    return generation


def _logprobs(body: dict[str, Any], name: str, default: int | None) -> int | None:
    """The alternatives per token field ``name`` asks for (``default`` when absent)."""
    expected = f"an integer in [0, {MAX_LOGPROBS}]"
    value = _get(body, name, (int,), default, expected)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise InvalidRequest(f"'{name}' must be {expected}, got {value}", name)
    return value


def _get(
    body: dict[str, Any], name: str, types: tuple[type, ...], default: Any, expected: str
) -> Any:
    """``body[name]`` if it has one of ``types`` (null means absent; True is not a number)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise InvalidRequest(f"'{name}' must be {expected}, got {value!r}", name)
    return value


def _refuse_unsupported(body: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if body.get(name):
            raise InvalidRequest(f"'{name}' is not supported by macbatch; leave it out", name)
