"""The `chat` command's options: help text, and bad values refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from tests.support.chat_app import cli


def test_help_lists_every_option():
    # Help is laid out to the terminal's width (COLUMNS); wide enough that no option is cut.
    result = CliRunner().invoke(cli(), ["chat", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in [
        "--model",
        "--system",
        "--temperature",
        "--top-p",
        "--max-tokens",
        "--kv-blocks",
        "--kv-bits",
        "--indexer-keys",
        "--history",
        "--export-dir",
    ]:
        assert option in result.output
    assert "demo" in result.output


def test_bad_sampling_values_are_refused_with_the_field_name(home):
    result = CliRunner().invoke(cli(), ["chat", "--temperature", "-1"])
    assert result.exit_code == 2
    assert "temperature" in result.output and "Traceback" not in result.output
    assert not (home / "chat.sqlite3").exists()  # refused before the history was opened


def test_bad_kv_bits_is_refused_before_anything_starts(home):
    result = CliRunner().invoke(cli(), ["chat", "--kv-bits", "2"])
    assert result.exit_code == 2
    assert "kv_bits must be 8, 4 or None" in result.output and "Traceback" not in result.output
    assert not (home / "chat.sqlite3").exists()


def test_a_broken_history_file_is_reported_without_a_traceback(home):
    broken = home / "broken.sqlite3"
    broken.write_text("this is not SQLite " * 100)
    result = CliRunner().invoke(cli(), ["chat", "--history", str(broken)])
    assert result.exit_code == 1
    assert str(broken) in result.output and "Move the file away" in result.output


def test_without_a_terminal_chat_refuses_and_exits(home):
    """Issue 65: `macbatch chat </dev/null | tail` drew into the pipe for ever; now it says why
    and exits non-zero, as the command line runs it (no terminal on either end)."""
    env = {**os.environ, "MACBATCH_HOME": str(home), "MACBATCH_NO_REEXEC": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "macbatch", "chat"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # a hang guard: the refusal comes before any model loads
    )
    assert done.returncode == 2, done.stderr
    assert "needs a terminal, and there is none on its input and output" in done.stderr
    assert "macbatch ask" in done.stderr
