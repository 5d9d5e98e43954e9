"""Request bodies as JSON text and as parsed values, bounded before anything reads them.

Two things in a body that json.loads accepts still break code further down: nesting thousands
deep (every recursive walk after the parse raises ``RecursionError``: the JSON encoder, the chat
template, jsonschema) and lone UTF-16 surrogates (``"\\ud800"`` is valid JSON, but the string
cannot be encoded as UTF-8, so the tokenizer, sqlite and every output file refuse it). Both are
refused here, naming where they are, for every front end: serve's HTTP bodies, run's rows and the
bodies run builds from them.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from macbatch.openai.errors import InvalidRequest

MAX_NESTING = 100  # arrays and objects inside each other in one body (or job row)


def load_json(text: bytes | str, what: str = "the request body") -> Any:
    """Parse JSON text; ``InvalidRequest`` for bad JSON, bad UTF-8 or nesting too deep for the
    parser (``check_value`` then applies the bounds: the request parsers call it)."""
    try:
        value = parse_json(text, what)
    except RecursionError:
        raise _too_deep(what) from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
    return value


def parse_json(text: bytes | str, what: str) -> Any:
    """``json.loads`` without what JSON itself has not: NaN, Infinity, a number past a float
    (no response could echo them: JSON has no way to write them), or an integer past the digits
    Python converts (its guard against slow conversions). Those are ``InvalidRequest``s; bad
    JSON raises as from ``json.loads``."""

    def no_constant(name: str) -> Any:
        raise InvalidRequest(f"{what} holds {name}, which is not a JSON number")

    def finite(number: str) -> float:
        value = float(number)
        if not math.isfinite(value):
            raise InvalidRequest(f"{what} holds {number}, past the range of a float")
        return value

    try:
        return json.loads(text, parse_constant=no_constant, parse_float=finite)
    except (json.JSONDecodeError, UnicodeDecodeError, InvalidRequest):
        raise
    except ValueError:  # the only other one: an integer longer than Python converts
        digits = sys.get_int_max_str_digits()
        raise InvalidRequest(f"{what} holds an integer of more than {digits} digits") from None


def check_value(value: Any, what: str = "the request body") -> None:
    """``InvalidRequest`` if ``value`` nests past ``MAX_NESTING`` or holds a string (a key
    included) that is not valid Unicode text; the message and ``param`` name where.

    An iterative walk, so it works on values nested deeper than Python's recursion limit."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, path, what)
        elif isinstance(item, (dict, list)):
            if len(path) >= MAX_NESTING:
                raise _too_deep(what, path)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_text(key, path, what)
                stack.append((child, (*path, key)))


def field_name(path: tuple[str | int, ...]) -> str | None:
    """``messages[0].content`` for ``("messages", 0, "content")``; None for the body itself."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or None


def _check_text(text: str, path: tuple[str | int, ...], what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = field_name(path)
        raise InvalidRequest(
            f"{where or what} holds a lone UTF-16 surrogate ({text[exc.start]!r} at character "
            f"{exc.start}), which is not Unicode text; send valid UTF-8 (a JSON escape such as "
            "\\ud83d must be followed by its low half, e.g. \\ude00)",
            where,
        ) from None


def _too_deep(what: str, path: tuple[str | int, ...] = ()) -> InvalidRequest:
    where = field_name(path)
    at = f" (at {where})" if where else ""
    return InvalidRequest(
        f"{what} nests arrays and objects more than {MAX_NESTING} deep{at}; "
        f"macbatch accepts at most {MAX_NESTING} levels",
        where,
    )
