"""A launchd property list that runs ``macbatch serve`` at login (macOS LaunchAgent)."""

from __future__ import annotations

import plistlib
from pathlib import Path

LABEL = "com.macbatch.serve"


def launchd_plist(
    arguments: list[str], log_file: Path, environment: dict[str, str], working_dir: Path
) -> str:
    """The plist text: start at login, restart after a crash (not after a clean stop), in
    ``working_dir`` (launchd's default is /, where relative paths mean nothing).

    ``environment`` is the job's (launchd gives it none of the shell's): the data directory when
    it is not the default, and the API key, there and not in the arguments so `ps` does not show
    it; keep the installed file private (chmod 600).
    """
    job: dict[str, object] = {
        "Label": LABEL,
        "ProgramArguments": arguments,
        "WorkingDirectory": str(working_dir.resolve()),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Interactive",  # not throttled like a background job
        "StandardOutPath": str(log_file),
        "StandardErrorPath": str(log_file),
    }
    if environment:
        job["EnvironmentVariables"] = environment
    return plistlib.dumps(job, sort_keys=False).decode()
