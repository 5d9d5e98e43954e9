"""Where macbatch keeps its data, and the user's defaults.

macOS: ~/Library/Application Support/macbatch; Linux: $XDG_DATA_HOME/macbatch (~/.local/share);
``MACBATCH_HOME`` overrides both (tests point it at a temporary directory).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_MODEL = os.environ.get("MACBATCH_MODEL", "demo")


def data_dir_environment() -> dict[str, str]:
    """The environment that gives a process started elsewhere (launchd, in /) this same data
    directory: ``MACBATCH_HOME``, made absolute, when it is set; nothing when the default holds."""
    if not os.environ.get("MACBATCH_HOME"):
        return {}
    return {"MACBATCH_HOME": str(data_dir().resolve())}


def data_dir() -> Path:
    """The app's data directory (history, ledgers), created on first use."""
    override = os.environ.get("MACBATCH_HOME")
    if override:
        path = Path(override).expanduser()
    elif sys.platform == "darwin":
        path = Path.home() / "Library" / "Application Support" / "macbatch"
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        path = Path(xdg) / "macbatch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    """Where the user's own settings live (``presets.yaml``): ``MACBATCH_HOME`` when set, the data
    directory on macOS (Application Support holds both), else $XDG_CONFIG_HOME/macbatch
    (~/.config). Not created: only read."""
    if os.environ.get("MACBATCH_HOME") or sys.platform == "darwin":
        return data_dir()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "macbatch"
