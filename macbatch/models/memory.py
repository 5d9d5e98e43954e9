"""How much memory this machine really has free, and whether a model fits in it.

A model that does not fit ends, on a Mac, in swap or a jetsam kill (the most reported failure of
local servers), so every front end that loads a model asks here first. The free figure is the
kernel's own: Linux's ``MemAvailable`` (/proc/meminfo: free pages plus the page cache and slab it
can reclaim); macOS's free, inactive and speculative pages (``vm_stat``, the same counters as
``host_statistics64``), which the kernel hands out before it compresses, swaps or kills. The
parsers take the text, so the tests feed them recorded outputs of both systems.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
MIB = 2**20
# vm_stat's page kinds the kernel can hand out without compressing or swapping anything
_VM_STAT_FREE = ("Pages free", "Pages inactive", "Pages speculative")


@dataclass(frozen=True)
class Memory:
    """The machine's memory and what of it is free now, in bytes."""

    total: int
    available: int


def parse_meminfo(text: str) -> Memory:
    """/proc/meminfo: ``MemTotal`` and ``MemAvailable`` (kB)."""
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB$", text, re.MULTILINE))
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        raise ValueError("/proc/meminfo has no MemTotal or MemAvailable line (Linux 3.14+)")
    return Memory(int(fields["MemTotal"]) * 1024, int(fields["MemAvailable"]) * 1024)


def parse_vm_stat(vm_stat: str, memsize: str) -> Memory:
    """macOS: ``vm_stat``'s free, inactive and speculative pages (its header gives the page
    size) against ``sysctl -n hw.memsize``."""
    page = re.search(r"page size of (\d+) bytes", vm_stat)
    if page is None:
        raise ValueError("vm_stat printed no page size")
    counts = dict(re.findall(r"^([A-Za-z][^:]*):\s+(\d+)\.?$", vm_stat, re.MULTILINE))
    missing = [kind for kind in _VM_STAT_FREE if kind not in counts]
    if missing:
        raise ValueError(f"vm_stat printed no {', '.join(missing)} line")
    free_pages = sum(int(counts[kind]) for kind in _VM_STAT_FREE)
    return Memory(int(memsize.strip()), free_pages * int(page.group(1)))


def read_memory(meminfo: Path = Path("/proc/meminfo")) -> Memory:
    """This machine's memory now (macOS through ``vm_stat`` and ``sysctl``, else /proc)."""
    if sys.platform == "darwin":
        return parse_vm_stat(_output(["vm_stat"]), _output(["sysctl", "-n", "hw.memsize"]))
    return parse_meminfo(meminfo.read_text())


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout


@dataclass(frozen=True)
class Need:
    """What loading a model takes at the least: its weights as stored and the smallest KV pool
    that serves a request (the elastic pool's start, ``EngineConfig.kv_start_mib``)."""

    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def weights_bytes(model_dir: Path) -> int:
    """The model's weights as stored (its safetensors files); MLX maps them as they are."""
    return sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))


def need_of(model_dir: Path, kv_start_mib: float) -> Need:
    return Need(weights_bytes(model_dir), int(kv_start_mib * MIB))


# What frees memory for another model, as each front end says it (``too_large``'s ``unload``):
# serve's idle models unload by themselves, and its limits can be lowered.
SERVE_UNLOAD = (
    "unload another model (they unload after serve --keep-alive seconds idle), or lower "
    "--max-loaded-models"
)


def too_large(
    name: str, need: Need, room: int, memory: Memory, unload: str = SERVE_UNLOAD
) -> str | None:
    """Why ``name`` cannot load into ``room`` bytes (None: it fits), with what to do
    (``unload``: how the front end frees another model's memory; empty: it holds no other)."""
    if need.total <= room:
        return None
    return (
        f"model {name!r} needs about {gib(need.total)} (weights {gib(need.weights)} and the "
        f"smallest KV pool, {need.kv / MIB:.0f} MiB) but only {gib(room)} of this machine's "
        f"{gib(memory.total)} can be given to it; use a smaller quantization of it (a 4-bit "
        f"or 3-bit variant), close other programs" + (f", or {unload}" if unload else "")
    )


def refusal_now(
    name: str, need: Need, read: Callable[[], Memory] | None = None, unload: str = SERVE_UNLOAD
) -> str | None:
    """Why ``name`` cannot load into the memory free now (None: it fits, or its need is not
    known: a hub id not downloaded yet); ``read``: how memory is read (``read_memory``)."""
    if not need.total:
        return None
    memory = (read or read_memory)()
    return too_large(name, need, memory.available, memory, unload)


def gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"
