"""Where macbatch keeps its data, and the user's defaults.

macOS: ~/Library/Application Support/macbatch; Linux: $XDG_DATA_HOME/macbatch (~/.local/share);
``MACBATCH_HOME`` overrides both (tests point it at a temporary directory).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_MODEL = os.environ.get("MACBATCH_MODEL", "demo")

# The system's OpenBLAS on Debian / Ubuntu: MLX's Linux CPU wheel links a reference BLAS about 40x
# slower for float32 matmuls, so `macbatch` re-executes with this preloaded (cli.main) and
# `macbatch doctor` reports whether it is.
OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")


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
