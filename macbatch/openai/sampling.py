"""Sampling fields of a request body -> ``SamplingParams``, under OpenAI's names.

The fields read are derived from ``SamplingParams`` itself, so a new sampling parameter is added
there (and in ``Defaults`` if its front-end default differs) and every front end reads it: the
body key is the field's name unless ``RENAMED`` says otherwise, and its JSON type comes from the
field's annotation. Values are range-checked by ``SamplingParams``; here only their JSON types.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

from macbatch.engine import InvalidSamplingParam, SamplingParams
from macbatch.openai.errors import InvalidRequest

# Fields a body does not set directly: logprobs comes from the endpoint's own logprobs fields,
# structured from response_format / guided_* / tools (options.py).
_NOT_FROM_BODY = ("logprobs", "structured")
SAMPLING_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(SamplingParams) if f.name not in _NOT_FROM_BODY
)
MAX_STOP = 16  # stop strings one request may give (OpenAI allows 4; vLLM any)
# Names a client may use for a field besides its own, taking precedence over it: OpenAI's newer
# chat name for max_tokens.
ALIASES = {"max_completion_tokens": "max_tokens"}
_JSON_TYPES: dict[type, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    bool: (bool,),
    str: (str,),
}
_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Defaults:
    """A front end's defaults for what a body leaves out (one table per front end)."""

    temperature: float
    max_tokens: int | None  # None: as many as the context allows


# The OpenAI API's own defaults: serve answers with them, and run uses them for OpenAI-batch rows,
# which are API bodies. Legacy completions stop at 16 tokens, chat replies may fill the context.
OPENAI_CHAT = Defaults(temperature=1.0, max_tokens=None)
OPENAI_COMPLETION = Defaults(temperature=1.0, max_tokens=16)


def sampling_params(
    body: dict[str, Any], defaults: Defaults, logprobs: int | None = None
) -> SamplingParams:
    """The body's sampling fields over ``defaults``; ``InvalidRequest`` names a bad field."""
    given: dict[str, Any] = {"temperature": defaults.temperature, "max_tokens": defaults.max_tokens}
    sent_as: dict[str, str] = {}  # field -> the alias the body gave it under (errors name it)
    for name in SAMPLING_FIELDS:
        if body.get(name) is not None:
            given[name] = _typed(body, name, name)
    for alias, name in ALIASES.items():
        if body.get(alias) is not None:
            given[name], sent_as[name] = _typed(body, alias, name), alias
    if given.get("top_k") == -1:  # vLLM's "off"
        given["top_k"] = 0
    try:
        return SamplingParams(**given, logprobs=logprobs)
    except InvalidSamplingParam as exc:
        key = sent_as.get(exc.field, exc.field)
        raise InvalidRequest(str(exc).replace(f" {exc.field}=", f" {key}=", 1), key) from None


def _typed(body: dict[str, Any], key: str, name: str) -> Any:
    """``body[key]`` checked against the JSON type of field ``name`` (True is no number)."""
    value = body[key]
    kind, in_list = _field_type(name)
    if in_list:
        value = [value] if isinstance(value, str) and kind is str else value
        limit = MAX_STOP if name == "stop" else None
        if not isinstance(value, list) or (limit is not None and len(value) > limit):
            bound = f" of at most {limit}" if limit else ""
            raise InvalidRequest(
                f"'{key}' must be {_WORDS[kind]} or a list{bound} of them, got {value!r}", key
            )
        return tuple(_checked(v, kind, key) for v in value)
    return _checked(value, kind, key)


def _checked(value: Any, kind: type, key: str) -> Any:
    if not isinstance(value, _JSON_TYPES[kind]) or (isinstance(value, bool) and kind is not bool):
        raise InvalidRequest(f"'{key}' must be {_WORDS[kind]}, got {value!r}", key)
    return value


@functools.cache
def _field_type(name: str) -> tuple[type, bool]:
    """(the JSON scalar type of field ``name``, whether the field is a tuple of them)."""
    hint = typing.get_type_hints(SamplingParams)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False
