"""`serve --install-service` (issue 65, item 17): a systemd user unit that repeats the serve
command line, read back with configparser; a unit macbatch did not write is never replaced."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from tests.support.cli_process import run_command


def _read(text: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(text)
    return unit


def test_install_service_writes_a_unit_and_keeps_a_foreign_one(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "MACBATCH_HOME": str(tmp_path / "home")}
    done = run_command(
        "serve", "--install-service", "--port", "8123", "--keep-alive", "-1", env=env
    )
    assert done.returncode == 0, done.stderr
    path = tmp_path / "config" / "systemd" / "user" / "macbatch-serve.service"
    unit = _read(path.read_text())
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[1] == "serve" and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--keep-alive") + 1] == "-1.0"
    assert unit["Service"]["Environment"] == f'"MACBATCH_HOME={tmp_path / "home"}"'
    assert unit["Install"]["WantedBy"] == "default.target"
    assert path.stat().st_mode & 0o777 == 0o600
    printed = run_command(
        "serve", "--print-systemd-unit", "--port", "8123", "--keep-alive", "-1", env=env
    )
    assert printed.stdout == path.read_text()

    path.write_text("[Service]\nExecStart=/bin/true\n")  # the user's own unit
    again = run_command("serve", "--install-service", env=env)
    assert again.returncode == 1 and "not written by macbatch" in again.stderr
    assert path.read_text() == "[Service]\nExecStart=/bin/true\n"
