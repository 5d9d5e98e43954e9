"""Rows of cells printed in left-aligned columns: the tables of models, cache and ps."""

from __future__ import annotations

from collections.abc import Sequence

import typer


def echo_columns(lines: Sequence[Sequence[str]]) -> None:
    """Each row on a line, every column as wide as its widest cell, two spaces between."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
