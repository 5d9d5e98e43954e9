"""Prompt templates of a job file: ``{field}`` names a field of the input row, nothing else (no
attribute access, no format spec: a template is data, and a row's text must not run anything)."""

from __future__ import annotations

import json
import string
from typing import Any


def template_fields(template: str) -> list[str]:
    """The row fields a template names, in order; ValueError for anything but plain `{name}`."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        hint = "write a literal brace as {{ or }}"
        raise ValueError(f"bad template {template!r}: {exc} ({hint})") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name:
            raise ValueError("empty field {} in template; name a field of the input row: {text}")
        if spec or conversion or any(c in name for c in ".[]"):
            raise ValueError(f"template field {{{name}}} must be a plain field name like {{text}}")
        names.append(name)
    return names


def render(template: str, row: dict[str, Any]) -> str:
    """Fill `{name}` fields from `row` (KeyError for a missing field); lists and dicts as JSON."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            value = row[name]
            if isinstance(value, (dict, list)):
                value = json.dumps(value, ensure_ascii=False)
            parts.append("" if value is None else str(value))
    return "".join(parts)
