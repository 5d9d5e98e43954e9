"""`macbatch run` in a child process (so a test can kill it with SIGKILL or Ctrl-C), and a wait
for its output file to reach a line count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = (
    "import typer; from macbatch.batch.command import run_command; "
    "app = typer.Typer(); app.command()(run_command); app()"
)
REPO = Path(__file__).resolve().parents[2]


def start_run(job_file: Path, *extra: str, in_flight: int = 2) -> subprocess.Popen[bytes]:
    """`macbatch run` in a child process, admitting ``in_flight`` requests at a time (two by
    default, so lines trickle)."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI, str(job_file), "--headless", "--max-in-flight",
         str(in_flight), *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def wait_for_lines(path: Path, process: subprocess.Popen[bytes], count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= count:
            return
        assert process.poll() is None, process.communicate()[1].decode()
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


def kill_9_after(job_file: Path, output: Path, count: int, in_flight: int = 2) -> int:
    """Start `macbatch run`, kill it with SIGKILL once ``output`` has ``count`` lines; how many
    lines it had written by then."""
    process = start_run(job_file, in_flight=in_flight)
    wait_for_lines(output, process, count)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return output.read_bytes().count(b"\n")
