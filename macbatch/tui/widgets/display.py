"""Text as the terminal may show it: shared by the message and reasoning views."""

from __future__ import annotations

# Control characters (from a model or a paste) would drive the terminal or break SVG screenshots:
# show them as Unicode "control pictures" instead (display only; the stored text is untouched).
_VISIBLE_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {0x7F: 0x2421}


def displayable(text: str) -> str:
    return text.translate(_VISIBLE_CONTROLS)


def counted(number: int, noun: str) -> str:
    """`1 token`, `2 tokens`: a count with its noun in the right number."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
