"""`serve --help` at 80 columns (issue 65, item 9): the options grouped in panels, each
description whole (none cut with an ellipsis), the page a screenful or two rather than 340
lines; the long explanations live in docs/serve.md."""

from __future__ import annotations

from tests.support.cli_process import run_command


def test_serve_help_fits_80_columns() -> None:
    done = run_command("serve", "--help", env={"COLUMNS": "80", "LINES": "50"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout and "..." not in done.stdout
    assert len(lines) <= 120, len(lines)  # 369 before the panels
    for panel in ("Models", "Network and clients", "Limits and timeouts", "Engine"):
        assert f"╭─ {panel} " in done.stdout, panel
    # every option is still listed, its name whole
    whole = ("--keep-volatile-prompt-lines", "--allow-private-image-urls", "--no-remote-images")
    for flag in whole:
        assert flag in done.stdout, flag
