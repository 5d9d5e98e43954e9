"""A chat session's settings, declared once, shared by the chat app and `macbatch ask`: the
system prompt, the thinking switch, and the sampling settings that the settings form, the
history's JSON column, the export and the engine request are all generated from.

A new sampling setting is one line in `SessionSettings` (a `SamplingParams` field name, a label
and a default). Its bounds are the engine's: constructing `SamplingParams` checks every value, so
the form accepts exactly what the engine accepts and shows the engine's own message otherwise.
Histories need no migration for it either: stored settings lacking it read as its default.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast, get_type_hints

from macbatch.engine import THINKING_SWITCH, InvalidSamplingParam, SamplingParams

LABEL = "label"  # the metadata key that marks a field as a sampling setting


def sampling(label: str, default: float) -> Any:
    """Declare a sampling setting: sent to the engine under the field's own name, shown in the
    settings form as `label`."""
    return field(default=default, metadata={LABEL: label})


@dataclass(frozen=True)
class SessionSettings:
    """What a session sends with each request: its system prompt, its sampling settings, and
    thinking on or off for templates with that switch (None: the template's own default).

    Always valid: construction runs the engine's checks (`InvalidSamplingParam` names the field).
    """

    system_prompt: str = ""
    temperature: float = sampling("Temperature", 0.7)
    top_p: float = sampling("top_p", 1.0)
    max_tokens: int = sampling("Max tokens", 512)
    # Keyword-only, so a setting added above does not shift what a positional call means.
    thinking: bool | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.sampling_params()

    def sampling_params(self) -> SamplingParams:
        """The engine parameters for a request of this session."""
        return SamplingParams(**{f.name: getattr(self, f.name) for f in SAMPLING_FIELDS})

    def template_kwargs(self) -> dict[str, bool] | None:
        """The chat template variables a session sets: thinking on or off, when it chose one."""
        return None if self.thinking is None else {THINKING_SWITCH: self.thinking}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SessionSettings:
        values = json.loads(text)
        return cls.from_values(values if isinstance(values, dict) else {})

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> SessionSettings:
        """Settings from stored values, by name. A missing value takes its default (a setting
        added since it was stored), an unknown one is dropped (a setting since removed), and a
        value of the wrong type or one the engine now refuses takes its default too: one odd row
        must not keep the whole history from opening."""
        kept: dict[str, Any] = {}
        for name, read in _READERS.items():
            if name in values:
                with suppress(TypeError, ValueError):
                    kept[name] = read(values[name])
        while True:
            try:
                return cls(**kept)
            except InvalidSamplingParam as error:
                if error.field not in kept:
                    raise
                del kept[error.field]


@dataclass(frozen=True)
class SettingField:
    """A sampling setting as the form, the export and the history see it."""

    name: str  # the `SessionSettings` and `SamplingParams` field
    label: str
    kind: type[int] | type[float]
    default: int | float

    @property
    def input_id(self) -> str:
        """The id of its input in the settings form."""
        return self.name.replace("_", "-")

    def text(self, value: float) -> str:
        """The value as the form and the export show it."""
        return f"{value:g}" if self.kind is float else str(value)

    def parse(self, text: str) -> int | float:
        """The form's text as a value; `ValueError` names the setting (its range is checked
        afterwards, by the engine)."""
        try:
            return self.kind(text.strip())
        except ValueError:
            noun = "a whole number" if self.kind is int else "a number"
            raise ValueError(f"{self.label.lower()} must be {noun}, got {text!r}") from None


def parse_settings(
    system_prompt: str, texts: Mapping[str, str], thinking: bool | None = None
) -> SessionSettings:
    """Settings from the form: the system prompt, each sampling setting's text by name, and the
    thinking switch; `ValueError` says which setting is wrong and what fits."""
    values: dict[str, Any] = {f.name: f.parse(texts[f.name]) for f in SAMPLING_FIELDS}
    return SessionSettings(system_prompt=system_prompt, thinking=thinking, **values)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return float(value)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value


def _switch(value: object) -> bool | None:
    """JSON's true/false/null, or the 1/0/NULL of the column this was kept in before."""
    if value is None or isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    raise TypeError(value)


_HINTS = get_type_hints(SessionSettings)
_READER_FOR_TYPE: dict[object, Callable[[object], object]] = {
    str: _text,
    float: _number,
    int: _whole,
    bool | None: _switch,
}
_READERS = {f.name: _READER_FOR_TYPE[_HINTS[f.name]] for f in fields(SessionSettings)}
SAMPLING_FIELDS: tuple[SettingField, ...] = tuple(
    SettingField(f.name, f.metadata[LABEL], _HINTS[f.name], cast("int | float", f.default))
    for f in fields(SessionSettings)
    if LABEL in f.metadata
)
