"""Checks on a loaded YAML job file that say where a bad value sits (file:line:column, the
dotted key) and suggest the key the user probably meant."""

from __future__ import annotations

import difflib
from typing import Any

from macbatch.batch.templates import template_fields
from macbatch.batch.yamlfile import JobFileError, LoadedYaml, PathKey


def dotted(key: PathKey) -> str:
    """`("jobs", 1, "sampling")` -> `jobs[1].sampling`."""
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "the top level"


def suggest(name: str, choices: tuple[str, ...], what: str = "keys") -> str:
    """`; did you mean 'x'?` when a close match exists, else the list of valid names."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f" (valid {what}: {', '.join(choices)})"


class YamlChecker:
    """Validation helpers that know where each value sits in the YAML file."""

    def __init__(self, loaded: LoadedYaml) -> None:
        self.loaded = loaded

    def fail(self, key: PathKey, message: str) -> JobFileError:
        return JobFileError(f"{self.loaded.where(key)}: {message}")

    def mapping(self, value: Any, key: PathKey, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"{dotted(key)} must be a mapping of keys to values")
        for name in value:
            if str(name) not in allowed:
                raise self.fail(
                    (*key, str(name)),
                    f"unknown key '{name}' in {dotted(key)}{suggest(str(name), allowed)}",
                )
        return value

    def text(self, value: Any, key: PathKey, *, empty_ok: bool = False) -> str:
        if not isinstance(value, str) or (not empty_ok and not value.strip()):
            raise self.fail(key, f"{dotted(key)} must be a non-empty string, got {value!r}")
        return value

    def integer(
        self, value: Any, key: PathKey, minimum: int, maximum: int | None = None, why: str = ""
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"{dotted(key)} must be an integer >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"{dotted(key)} must be at most {maximum:,}, got {value:,}{why}")
        return value

    def boolean(self, value: Any, key: PathKey) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"{dotted(key)} must be true or false, got {value!r}")
        return value

    def template(self, value: Any, key: PathKey) -> str:
        text = self.text(value, key)
        try:
            template_fields(text)
        except ValueError as exc:
            raise self.fail(key, f"{dotted(key)}: {exc}") from None
        return text
