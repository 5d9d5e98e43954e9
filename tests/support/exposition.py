"""A strict reader of the Prometheus text exposition format (version 0.0.4), written from the
format's specification, independent of the server's renderer: every line is a ``# HELP``, a
``# TYPE``, a comment or one sample (``name{label="value",...} value``, a label value escaping
only backslash, double quote and line feed); anything else is an error. prometheus_client's own
parser is used as well where it is installed."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_NUMBER = r"[+-]?(?:Inf|NaN|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_SAMPLE = re.compile(
    rf"(?P<name>{_NAME})(?:\{{(?P<labels>(?:{_LABEL}={_VALUE})(?:,{_LABEL}={_VALUE})*,?)?\}})?"
    rf" (?P<value>{_NUMBER})(?: -?[0-9]+)?"
)
_PAIR = re.compile(rf"({_LABEL})=({_VALUE})")
_META = re.compile(
    rf"# (?:HELP {_NAME}(?: .*)?|TYPE {_NAME} (?:counter|gauge|histogram|summary|untyped))"
)
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """The samples of an exposition (``ValueError`` naming the first line that is not one)."""
    samples = []
    for number, line in enumerate(text.split("\n"), 1):
        meta = line.startswith(("# HELP", "# TYPE"))
        if not line or _META.fullmatch(line) or (line.startswith("#") and not meta):
            continue
        found = _SAMPLE.fullmatch(line)
        if found is None:
            raise ValueError(f"line {number} is not valid exposition: {line!r}")
        labels = {
            key: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group()], value[1:-1])
            for key, value in _PAIR.findall(found["labels"] or "")
        }
        samples.append(Sample(found["name"], labels, float(found["value"])))
    _check_with_prometheus_client(text, len(samples))
    return samples


def _check_with_prometheus_client(text: str, count: int) -> None:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    parsed = [s for family in text_string_to_metric_families(text) for s in family.samples]
    if len(parsed) != count:
        raise ValueError(f"prometheus_client reads {len(parsed)} samples, the grammar {count}")
