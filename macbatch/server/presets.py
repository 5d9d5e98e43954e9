"""A request whose ``model`` names a preset (``"model": "terse"``) gets the preset's system
prompt and sampling settings for what its body leaves out, as ``chat -m terse`` does
(docs/models.md, "Presets"); what the body gives wins. Each API names those fields its own way,
so each has a table here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from macbatch.engine import THINKING_SWITCH
from macbatch.models.presets import Preset

_SAME_NAMES = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_tokens"}


@dataclass(frozen=True)
class BodyNames:
    """Where an API's body takes a preset's settings."""

    # preset setting -> the body keys that set it (the first is written; any given: left alone)
    sampling: Mapping[str, tuple[str, ...]]
    # the body field the system prompt goes in; "messages": a first system message; None: none
    system: str | None
    thinking: bool  # the thinking switch goes in chat_template_kwargs


def _keys(**renamed: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {setting: renamed.get(setting, (key,)) for setting, key in _SAME_NAMES.items()}


CHAT = BodyNames(
    _keys(max_tokens=("max_tokens", "max_completion_tokens")), system="messages", thinking=True
)
COMPLETION = BodyNames(_keys(), system=None, thinking=False)  # a raw prompt: no system message
RESPONSES = BodyNames(_keys(max_tokens=("max_output_tokens",)), "instructions", thinking=False)
# Anthropic's max_tokens is required, so a body always gives it
MESSAGES = BodyNames(_keys(), system="system", thinking=False)


def preset_named(requested: Any) -> Preset | None:
    """The preset a body's ``model`` names, or None (not a preset, or not a string: the
    parser's to refuse)."""
    if not isinstance(requested, str):
        return None
    from macbatch.models.names import resolve

    try:
        return resolve(requested).preset
    except ValueError:  # UnknownModel, PresetError: the pool says so when it leases
        return None


def with_preset(body: dict[str, Any], names: BodyNames) -> dict[str, Any]:
    """``body`` with its preset's settings where it gives none (``body`` itself when its model
    names no preset)."""
    preset = preset_named(body.get("model"))
    if preset is None:
        return body
    out = dict(body)
    for setting, keys in names.sampling.items():
        if setting in preset.values and all(out.get(key) is None for key in keys):
            out[keys[0]] = preset.values[setting]
    system = preset.system
    messages = out.get("messages")
    if system and names.system == "messages" and isinstance(messages, list):
        roles = {m.get("role") for m in messages if isinstance(m, dict)}
        if not roles & {"system", "developer"}:
            out["messages"] = [{"role": "system", "content": system}, *messages]
    elif system and names.system and out.get(names.system) is None:
        out[names.system] = system
    thinking = preset.values.get("thinking")
    if names.thinking and thinking is not None and out.get("chat_template_kwargs") is None:
        out["chat_template_kwargs"] = {THINKING_SWITCH: thinking}
    return out
