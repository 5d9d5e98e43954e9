"""Starting several ranks of one command on 127.0.0.1 over MLX's ring backend, with deadlines, so
a test of the distributed engine can never hang CI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MLX_LAUNCH = Path(sys.executable).with_name("mlx.launch")
# The ranks share this machine's cores: one BLAS thread each keeps them from oversubscribing it.
RANK_ENV = {"OPENBLAS_NUM_THREADS": "1"}


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that are free now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count < 65536 and all(_free(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"found no {count} consecutive free ports on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def mlx_launch(command: list[str], ranks: int, timeout_s: float) -> subprocess.CompletedProcess:
    """``mlx.launch -n RANKS --backend ring -- COMMAND`` from the repository root."""
    launcher = [str(MLX_LAUNCH), "-n", str(ranks), "--backend", "ring"]
    launcher += ["--starting-port", str(free_port_run(ranks)), "--"]
    return subprocess.run(
        launcher + command,
        cwd=REPO,
        env=dict(os.environ, **RANK_ENV),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def spawn_ranks(
    command: list[str],
    ranks: int,
    directory: Path,
    rank_env: dict[int, dict[str, str]] | None = None,
) -> list[subprocess.Popen]:
    """Start ``command`` once per rank as mlx.launch would (MLX_RANK, a ring hostfile), but as
    children of this process, so a test can kill one of them (or give one its own
    environment: ``rank_env``)."""
    hostfile = ring_hostfile(directory, ranks)
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, **RANK_ENV, MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile))
        env.update((rank_env or {}).get(rank, {}))
        processes.append(
            subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    return processes


def ring_hostfile(directory: Path, ranks: int) -> Path:
    """A ring backend hostfile (what mlx.launch writes) for ``ranks`` ranks on free ports."""
    first = free_port_run(ranks)
    hostfile = directory / "ring-hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{first + r}"] for r in range(ranks)]))
    return hostfile


def stop_all(processes: list[subprocess.Popen]) -> None:
    """Kill whatever is still running (a test's cleanup)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()
