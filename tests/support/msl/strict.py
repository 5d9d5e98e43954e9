"""Strict mode: reject C++ that compiles here but that MSL forbids.

The kernel unit is compiled freestanding with the names MSL lacks poisoned and variable-length
arrays as errors; the object file is then checked for external symbols beyond the shim's runtime
and libm, writable static data, vtables, and recursion (a cycle in GCC's call graph).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

POISON = (
    "#pragma GCC poison std new delete double goto thread_local virtual try catch throw typeid "
    "dynamic_cast malloc free printf\n"
)
FLAGS = ["-Werror=vla", "-fcallgraph-info"]

_ALLOWED_EXTERNAL = re.compile(
    r"^(mslemu_\w+|memcpy|memset|memmove|__(trunc|extend)\w+"
    r"|(exp|exp2|log|log2|tanh|sqrt|floor|ceil|pow|fmod)f?)$"
)


def check_object(work: Path, cxx: str) -> None:
    """Raise MSLError if ``kernel.o`` in ``work`` uses anything a Metal kernel cannot."""
    from tests.support.msl.emulator import MSLError

    nm = subprocess.run(["nm", "-C", "kernel.o"], capture_output=True, text=True, cwd=work)
    problems = []
    for line in nm.stdout.splitlines():
        parts = line.split()
        kind, symbol = (
            (parts[0], " ".join(parts[1:]))
            if len(parts) >= 2 and len(parts[0]) == 1
            else (parts[1], " ".join(parts[2:]))
        )
        if kind == "U" and not _ALLOWED_EXTERNAL.match(symbol):
            problems.append(f"calls {symbol}, which does not exist in Metal")
        elif kind in "DdBb":
            problems.append(f"writable static data '{symbol}' (not allowed in a Metal kernel)")
        elif symbol.startswith("vtable"):
            problems.append(f"virtual functions ({symbol})")
    cycle = _recursion(work)
    if cycle:
        problems.append("recursion: " + " -> ".join(cycle))
    if problems:
        raise MSLError("strict MSL check failed:\n  " + "\n  ".join(problems))


def _recursion(work: Path) -> list[str]:
    """A call cycle in the GCC call graph (``kernel.ci``), or [] (clang has no such output)."""
    ci = work / "kernel.ci"
    if not ci.exists():
        return []
    edges: dict[str, set[str]] = {}
    for m in re.finditer(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"', ci.read_text()):
        edges.setdefault(m.group(1), set()).add(m.group(2))
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in list(edges):
        if node not in state:
            found = visit(node)
            if found:
                return _demangle([n.split(":")[-1] for n in found])
    return []


def _demangle(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt", *names], capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else names
