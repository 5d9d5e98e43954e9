"""Text as the terminal may show it: shared by the views that show what a user or a model wrote
(messages, reasoning, chat titles, search hits) and the Markdown export."""

from __future__ import annotations

# Control characters (from a model or a paste) would drive the terminal or break SVG screenshots:
# show them as Unicode "control pictures" instead (display only; the stored text is untouched).
_VISIBLE_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {0x7F: 0x2421}
# Characters that change how wide the one before them is drawn, where terminals disagree with
# Textual (and with each other): a variation selector (U+FE0F turns "❤" into an emoji two cells
# wide for Textual; tmux 3.3 draws it in one) and a skin-tone modifier (two cells for Textual
# after its emoji, four in tmux). Where they disagree, the rest of the line shifts and a
# border's character is drawn over, or pushed off; the base character alone is the same width
# everywhere.
_WIDTH_MODIFIERS = {0xFE0E: None, 0xFE0F: None} | {c: None for c in range(0x1F3FB, 0x1F400)}
_ON_SCREEN = _VISIBLE_CONTROLS | _WIDTH_MODIFIERS


def pictured_controls(text: str) -> str:
    """`text` with its control characters as their pictures (for a file a terminal may print)."""
    return text.translate(_VISIBLE_CONTROLS)


def displayable(text: str) -> str:
    """`text` as the app draws it: control characters as pictures, and without the characters
    whose width terminals disagree on (display only: the history and copies keep them)."""
    return text.translate(_ON_SCREEN)


def counted(number: int, noun: str) -> str:
    """`1 token`, `2 tokens`: a count with its noun in the right number."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
