"""YAML loading that remembers where every value came from.

Job files are written by hand, so every error message should point at a line and column. PyYAML's
composer keeps positions on its nodes; this module builds plain Python values from those nodes and
keeps a map from each value's path (``("jobs", 1, "sampling")``) to its position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PathKey = tuple[str | int, ...]
MAX_REPEATED = 100_000  # values aliases may repeat in one job file (a YAML "billion laughs" guard)


class JobFileError(Exception):
    """A problem with the job file or its inputs, already phrased for the user."""


@dataclass
class LoadedYaml:
    """A YAML document as plain values, plus the position of every value in it."""

    path: Path
    data: Any
    marks: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    built: set[int] = field(default_factory=set, repr=False)  # the nodes read so far (by id)
    repeated: int = field(default=0, repr=False)  # values read again through an alias

    def where(self, key: PathKey) -> str:
        """`file:line:column` of the value at `key`, or of its nearest ancestor that has one."""
        while key not in self.marks and key:
            key = key[:-1]
        line, column = self.marks.get(key, (1, 1))
        return f"{self.path}:{line}:{column}"


def load_yaml(path: Path) -> LoadedYaml:
    """Parse `path`; syntax errors and unknown tags become a `JobFileError` naming
    file:line:column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobFileError(f"job file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"cannot read job file {path}: {exc}") from None
    loaded = LoadedYaml(path=path, data=None)
    # Composing finds syntax errors; building, values no safe loader constructs (a tag such as
    # !!python/name:os.system or !shout): both are the file's error, at its line and column.
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            loaded.data = _build(node, (), loaded, yaml.constructor.SafeConstructor())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "invalid YAML"
        if isinstance(exc, yaml.constructor.ConstructorError):
            problem += "; a job file holds strings, numbers, booleans, lists and mappings"
            raise JobFileError(f"{where}: YAML value error: {problem}") from None
        raise JobFileError(f"{where}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: YAML error: {exc}") from None
    except RecursionError:
        raise JobFileError(f"{path}: the YAML nests too deep to read") from None
    return loaded


def _build(
    node: yaml.Node, key: PathKey, loaded: LoadedYaml, scalars: yaml.constructor.SafeConstructor
) -> Any:
    """Turn a composed node into plain values, recording each node's position."""
    loaded.marks[key] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if (
        id(node) in loaded.built
    ):  # an alias: a few lines of them can repeat a node billions of times
        loaded.repeated += 1
        if loaded.repeated > MAX_REPEATED:
            raise JobFileError(
                f"{loaded.where(key)}: aliases (*name) repeat more than {MAX_REPEATED:,} values "
                "(anchors that repeat others?); write the values out"
            )
    loaded.built.add(id(node))
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise JobFileError(f"{loaded.where(key)}: a mapping key must be a plain value")
            name = scalars.construct_object(key_node)
            if name in result:
                where = f"{loaded.path}:{key_node.start_mark.line + 1}"
                raise JobFileError(f"{where}: duplicate key '{name}'")
            child = (*key, str(name))
            result[name] = _build(value_node, child, loaded, scalars)
            loaded.marks[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*key, i), loaded, scalars) for i, item in enumerate(node.value)]
    return scalars.construct_object(node, deep=True)
