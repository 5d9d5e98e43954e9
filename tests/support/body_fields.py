"""Every field of a body that a request parser reads, found by the parser itself: a valid body is
parsed with each of its objects replaced by one that records every key looked up, at any depth.
A field added to a parser is then fuzzed with no change to the tests. (A helper of the fuzz
tests, kept in tests/support/ with the others so that no test imports another test module.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FieldPath = tuple[str | int, ...]


class _Recording(dict):
    """A JSON object that notes each key the parser asks for (get, [], in) with its path."""

    def __init__(self, value: dict[str, Any], path: FieldPath, seen: set[FieldPath]) -> None:
        super().__init__({k: _recording(v, (*path, k), seen) for k, v in value.items()})
        self._path, self._seen = path, seen

    def get(self, key: Any, default: Any = None) -> Any:
        self._seen.add((*self._path, key))
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._seen.add((*self._path, key))
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._seen.add((*self._path, key))  # type: ignore[arg-type]
        return super().__contains__(key)


def _recording(value: Any, path: FieldPath, seen: set[FieldPath]) -> Any:
    if isinstance(value, dict):
        return _Recording(value, path, seen)
    if isinstance(value, list):
        return [_recording(v, (*path, i), seen) for i, v in enumerate(value)]
    return value


def fields_read(parse: Callable[[Any], Any], body: dict[str, Any]) -> list[FieldPath]:
    """The paths of every key ``parse`` looks up while it reads ``body`` (which must parse),
    whose parent the body holds (so a value can be put there)."""
    seen: set[FieldPath] = set()
    parse(_recording(body, (), seen))
    return sorted((p for p in seen if _holds(body, p[:-1])), key=repr)


def _holds(body: Any, path: FieldPath) -> bool:
    for part in path:
        in_list = isinstance(body, list) and isinstance(part, int) and part < len(body)
        if not (in_list or (isinstance(body, dict) and part in body)):
            return False
        body = body[part]
    return isinstance(body, dict)


def with_raw_value(body: dict[str, Any], path: FieldPath, raw: str) -> bytes:
    """``body`` as JSON text with the JSON text ``raw`` at ``path``: a number past what Python's
    json module writes (2**64 it writes, 5,000 digits it does not), NaN, a lone surrogate."""
    marker = "\x00fuzzed\x00"
    copy = json.loads(json.dumps(body))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = marker
    return json.dumps(copy).replace(json.dumps(marker), raw).encode()
