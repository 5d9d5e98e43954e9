"""A systemd user unit that runs ``macbatch serve`` at login (Linux), the launchd plist's
twin: written by ``serve --install-service`` into ``~/.config/systemd/user/``, never over a
unit macbatch did not write."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

UNIT_NAME = "macbatch-serve.service"
MARK = "# Written by macbatch serve --install-service"


def systemd_unit(arguments: list[str], working_dir: Path, environment: dict[str, str]) -> str:
    """The unit text: start with the user's session, restart after a crash (not after a clean
    stop), in ``working_dir``; ``environment`` (MACBATCH_HOME, the API key) goes in the unit,
    not the command line, so ``ps`` does not show the key: keep the file private."""
    lines = [
        MARK,
        "[Unit]",
        "Description=macbatch serve: a local OpenAI-compatible API",
        "",
        "[Service]",
        f"ExecStart={shlex.join(arguments)}",
        f"WorkingDirectory={working_dir.resolve()}",
        *(f'Environment="{name}={value}"' for name, value in environment.items()),
        "Restart=on-failure",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def unit_path() -> Path:
    """Where systemd looks for a user's units ($XDG_CONFIG_HOME, else ~/.config)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


def install_unit(text: str, path: Path) -> None:
    """Write the unit (mode 600: it may hold the API key); a file there that macbatch did not
    write is left alone and refused."""
    if path.exists() and not path.read_text(errors="replace").startswith(MARK):
        raise FileExistsError(f"{path} exists and was not written by macbatch; not replacing it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
