"""The CPU attention kernel (`paged_attention_cpu.cpp`): built on first use, then cached.

Without Metal, MLX runs on its CPU backend, where the pure-MLX reference spends most of a
prefill step in MLX's scalar ``exp`` and most of a decode step gathering pages. This C++ MLX
primitive reads the pages in place with a vectorised exp. It is compiled against the installed
``mlx`` (headers and ``libmlx``) and ``nanobind`` with the machine's C++ compiler, the way MLX
itself compiles its CPU kernels at run time, with ``-march=native`` because it is built on the
machine that runs it. The build takes about 15 s once; the result is cached under
``$XDG_CACHE_HOME/macbatch`` (``MACBATCH_CACHE`` overrides) keyed by everything that goes into
it. Any failure (no compiler, no nanobind) raises `CpuKernelUnavailable` and the registry falls
back to the reference. `CpuKernelBackend` is the kernel's entry in the backend registry.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import mlx.core as mx

from macbatch.metal.backend import (
    AttentionBackend,
    AttentionMetadata,
    BackendUnavailable,
    LayerParams,
    Pages,
    check_row_source,
)
from macbatch.metal.quant import QuantizedPages
from macbatch.metal.reference import paged_attention_reference

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("paged_attention_cpu.cpp")
MODULE_NAME = "_paged_attention_cpu"
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
_loaded: dict[str, ModuleType] = {}


class CpuKernelUnavailable(BackendUnavailable):
    """The CPU kernel cannot be built or loaded here; the reference serves instead."""


def cache_dir() -> Path:
    override = os.environ.get("MACBATCH_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "macbatch"


def _toolchain() -> tuple[str, Path, Path, Path]:
    """(compiler, nanobind dir, mlx dir, Python headers), or why the build cannot happen."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        raise CpuKernelUnavailable("no C++ compiler found (install g++ or set CXX)")
    try:
        import nanobind
    except ImportError as exc:
        raise CpuKernelUnavailable("nanobind is not installed (pip install nanobind)") from exc
    mlx_dir = Path(mx.__file__).parent
    if not (mlx_dir / "include" / "mlx" / "mlx.h").exists():
        raise CpuKernelUnavailable(f"this mlx install has no C++ headers under {mlx_dir}")
    python = Path(sysconfig.get_paths()["include"])
    if not (python / "Python.h").exists():
        raise CpuKernelUnavailable(f"no Python headers in {python} (install python3-dev)")
    return compiler, Path(nanobind.__file__).parent, mlx_dir, python


def _commands(toolchain: tuple[str, Path, Path, Path], out: Path, tmp: Path) -> list[list[str]]:
    """Two compiles (run in parallel) and a link."""
    cxx, nb, mlx_dir, python = toolchain
    common = ["-fPIC", "-fvisibility=hidden", "-DNDEBUG", f"-I{nb / 'include'}", f"-I{python}"]
    nanobind_lib = [
        cxx, "-std=c++17", "-O2", *common, "-fno-strict-aliasing", "-DNB_BUILD",
        "-DNB_COMPACT_ASSERTIONS", f"-I{nb / 'ext' / 'robin_map' / 'include'}",
        "-c", str(nb / "src" / "nb_combined.cpp"), "-o", str(tmp / "nanobind.o"),
    ]  # fmt: skip
    kernel = [
        cxx, "-std=c++20", "-O3", "-march=native", "-ffp-contract=fast", *common, "-DNB_DOMAIN=mlx",
        f"-I{mlx_dir / 'include'}", "-c", str(SOURCE), "-o", str(tmp / "kernel.o"),
    ]  # fmt: skip
    mac = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
    link = [
        cxx, "-shared", *mac, str(tmp / "kernel.o"), str(tmp / "nanobind.o"), "-o", str(out),
        f"-L{mlx_dir / 'lib'}", "-lmlx", f"-Wl,-rpath,{mlx_dir / 'lib'}",
    ]  # fmt: skip
    return [nanobind_lib, kernel, link]


def _build_key(toolchain: tuple[str, Path, Path, Path]) -> str:
    """Everything that goes into the binary: source, flags, compiler, mlx, nanobind, Python."""
    compiler = subprocess.run([toolchain[0], "--version"], capture_output=True, text=True).stdout
    commands = " ".join(" ".join(c) for c in _commands(toolchain, Path("out"), Path("tmp")))
    nanobind_init = (toolchain[1] / "__init__.py").read_text()
    parts = [
        SOURCE.read_text(),
        commands,
        compiler,
        importlib.metadata.version("mlx"),
        nanobind_init,
        sys.version,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _build(toolchain: tuple[str, Path, Path, Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    log.warning("building macbatch's CPU attention kernel (once, about 15 seconds)")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        staged = tmp_path / target.name
        *compiles, link = _commands(toolchain, staged, tmp_path)
        running = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in compiles]
        for command, proc in zip(compiles, running):
            _, err = proc.communicate()
            if proc.returncode:
                raise CpuKernelUnavailable(f"{Path(command[-3]).name} failed to compile:\n{err}")
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode:
            raise CpuKernelUnavailable(f"linking the CPU kernel failed:\n{done.stderr}")
        os.replace(staged, target)  # atomic: a concurrent build never sees half a file


def load_extension() -> ModuleType:
    """The compiled module, building it first if this exact build is not cached."""
    if "module" in _loaded:
        return _loaded["module"]
    toolchain = _toolchain()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = cache_dir() / f"cpu-kernel-{_build_key(toolchain)}" / f"{MODULE_NAME}{suffix}"
    if not target.exists():
        try:
            _build(toolchain, target)
        except OSError as exc:  # an unwritable cache, a compiler that cannot be started
            raise CpuKernelUnavailable(f"cannot build in {target.parent}: {exc}") from exc
    spec = importlib.util.spec_from_file_location(MODULE_NAME, target)
    if spec is None or spec.loader is None:
        raise CpuKernelUnavailable(f"cannot import {target}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise CpuKernelUnavailable(f"cannot import {target}: {exc}") from exc
    _loaded["module"] = module
    return module


def serves(head_dim: int, block_size: int) -> bool:
    """Whether the kernel takes these shapes (else the reference does): for latent pages,
    ``head_dim`` is the row's width (any value width up to it is served)."""
    return head_dim % 8 == 0 and block_size in SUPPORTED_BLOCK_SIZES


def paged_attention_cpu(
    q: mx.array, k_pages: Pages, v_pages: Pages, meta: AttentionMetadata, layer: LayerParams
) -> mx.array:
    """Varlen paged attention (contract in ``reference.py``) through the C++ CPU primitive.

    Head sizes that are not a multiple of 8 go to the reference instead (so would page sizes
    other than 8, 16 or 32, which `EngineConfig` does not allow). Quantized pages
    (``QuantizedPages``) are dequantized page by page inside the kernel. Latent pages
    (``layer.value_dim``) are read once per row: the values are the leading columns of the
    key rows the kernel has just read (``v_pages`` is not read). Sparse attention
    (``layer.selected``): each query row reads only the rows its list names, gathered in place.
    A second source of rows (``layer.rows``): each query row's list of rows, read through their
    own block table into the same softmax.
    """
    scale, sliding_window, softcap, sinks, value_dim, selected, _ = layer
    if not serves(q.shape[-1], k_pages.shape[2]):
        return paged_attention_reference(q, k_pages, v_pages, meta, layer)
    row_inputs = _row_inputs(q, k_pages, meta, layer)
    if value_dim is not None:
        v_pages = k_pages
    quantized = {}
    if isinstance(k_pages, QuantizedPages) and isinstance(v_pages, QuantizedPages):
        quantized = dict(
            k_scales=k_pages.scales, v_scales=v_pages.scales, bits=k_pages.bits,
            group_size=k_pages.group_size,
        )  # fmt: skip
        k_pages, v_pages = k_pages.codes, v_pages.codes
    return load_extension().paged_attention(
        q, k_pages, v_pages, meta.block_tables, meta.seq_lens, meta.cu_seqlens_q,
        scale, sliding_window or 0, softcap or 0.0, sinks, **quantized, value_dim=value_dim or 0,
        selected=selected, **row_inputs,
    )  # fmt: skip


def _row_inputs(q: mx.array, k_pages: Pages, meta: AttentionMetadata, layer: LayerParams) -> dict:
    """The kernel's arguments for the second source of rows (none without one): its pages
    (codes and scales when quantized), block table and lists."""
    if layer.rows is None:
        return {}
    check_row_source(q, k_pages, meta, layer)
    pages, table, selected = layer.rows
    scales = pages.scales if isinstance(pages, QuantizedPages) else None
    codes = pages.codes if isinstance(pages, QuantizedPages) else pages
    return dict(row_pages=codes, row_scales=scales, row_tables=table, row_selected=selected)


class CpuKernelBackend(AttentionBackend):
    """The CPU kernel as a registry entry: for MLX's CPU backend only (the primitive has no GPU
    implementation), so not where Metal runs."""

    name = "cpu"
    label = "CPU kernel"

    def available(self) -> str | None:
        return "Metal runs the Metal kernel" if mx.metal.is_available() else None

    def prepare(self) -> None:
        try:
            load_extension()
        except OSError as exc:  # a cache or compiler that cannot be reached: fall back
            raise CpuKernelUnavailable(str(exc)) from exc

    def traceable(self, head_dim: int, block_size: int) -> bool:
        """The kernel plans its work at evaluation, from the metadata arrays (and reads
        ``selected`` as one, so sparse calls trace too)."""
        return serves(head_dim, block_size)

    __call__ = staticmethod(paged_attention_cpu)
