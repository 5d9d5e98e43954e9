"""``macbatch ARGS`` in a child process, as a user runs it, with bytes in and text out (hostile
input: stdin that is not UTF-8, a stray environment variable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_command(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    merged = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "macbatch", *args],
        env=merged, input=stdin, capture_output=True, timeout=300,
    )  # fmt: skip
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )  # fmt: skip
