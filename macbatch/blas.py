"""Which OpenBLAS the command line preloads on Linux, decided in one place for the CLI's
re-exec (cli.main), `scripts/test.sh` (`python3 -m macbatch.blas` prints the path) and
`macbatch doctor`.

MLX's Linux CPU wheel links a reference BLAS about 12x slower for float32 matmuls than
OpenBLAS on one core. The system's OpenBLAS (Debian / Ubuntu `libopenblas0-pthread`) comes
first; without it, the `cmeel-openblas` wheel (a Linux-only dependency, the one OpenBLAS on
PyPI that exports the plain `cblas_sgemm` / `sgetrf_` symbols MLX links against, where
scipy-openblas prefixes them with `scipy_`). That wheel is one build per release for one CPU
target (0.3.29: Zen/Haswell-class AVX2; 0.3.31: AVX-512 only) and links the system's
libgfortran.so.5, so it is used only after a child process has loaded it and multiplied with
it: a CPU it was not built for, or a machine without libgfortran, falls back to the reference
BLAS with the reason, never a crash. ``MACBATCH_BLAS`` chooses: ``auto`` (the default),
``wheel`` (skip the system's, to measure the wheel), ``none`` (preload nothing).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

WHEEL = "cmeel-openblas"
CHOICE_VARIABLE = "MACBATCH_BLAS"
CHOICES = ("auto", "wheel", "none")
# A 64x64 product through the library in a child process: a kernel built for another CPU dies
# there (SIGILL), a missing libgfortran fails the load there, and neither touches the caller.
PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
n = 64
a = (ctypes.c_float * (n * n))(*([1.0] * (n * n)))
c = (ctypes.c_float * (n * n))()
f, i, p = ctypes.c_float, ctypes.c_int, ctypes.c_void_p
lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
lib.cblas_sgemm(101, 111, 111, n, n, n, 1.0, a, n, a, n, 0.0, c, n)
sys.exit(0 if c[0] == n and c[n * n - 1] == n else 3)
"""


@dataclass(frozen=True)
class Blas:
    """The BLAS to preload (``path`` None: MLX's own reference BLAS) and what to tell a user."""

    path: Path | None
    description: str


def system_openblas() -> Path:
    """Debian / Ubuntu's pthread OpenBLAS (package libopenblas0-pthread)."""
    return Path(f"/usr/lib/{platform.machine()}-linux-gnu/openblas-pthread/libblas.so.3")


def wheel_openblas() -> Path | None:
    """The cmeel-openblas wheel's library, when that wheel is installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution(WHEEL).locate_file("cmeel.prefix/lib/libopenblas.so.0")))
    except PackageNotFoundError:
        return None
    return path if path.exists() else None


def probe(path: Path | str) -> str | None:
    """Why the library at `path` cannot be used on this machine (None: it can)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120
    )
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    if done.returncode < 0:  # a signal: SIGILL is an instruction this CPU lacks
        said = [f"it died of signal {-done.returncode}: built for another CPU"]
    return said[0]


def choose() -> Blas:
    """The BLAS to preload here, by ``MACBATCH_BLAS``; the description says why."""
    reference = "MLX's reference BLAS (slow)"
    choice = os.environ.get(CHOICE_VARIABLE, "auto")
    if choice not in CHOICES:
        return Blas(None, f"{reference}: {CHOICE_VARIABLE}={choice} is none of {CHOICES}")
    if choice == "none":
        return Blas(None, f"{reference}: {CHOICE_VARIABLE}=none")
    system = system_openblas()
    if choice == "auto" and system.exists():
        return Blas(system, f"the system's OpenBLAS ({system})")
    wheel = wheel_openblas()
    if wheel is None:
        return Blas(None, f"{reference}: no system OpenBLAS and no {WHEEL} wheel; pip install "
                    f"{WHEEL} or apt-get install libopenblas0-pthread")  # fmt: skip
    problem = probe(wheel)
    if problem is not None:
        return Blas(None, f"{reference}: the {WHEEL} wheel does not run here ({problem}); "
                    "apt-get install libopenblas0-pthread")  # fmt: skip
    return Blas(wheel, f"OpenBLAS from the {WHEEL} wheel ({wheel})")


def preloaded() -> str | None:
    """The OpenBLAS this process was started with (in LD_PRELOAD), if any."""
    found = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if "openblas" in p]
    return found[0] if found else None


if __name__ == "__main__":  # scripts/test.sh: the path to preload, or nothing
    chosen = choose().path
    print(chosen or "")
