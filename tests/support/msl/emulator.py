"""Runs ``mx.fast.metal_kernel`` bodies on the CPU: the MSL emulator's Python side.

``Emulator().metal_kernel(...)`` takes exactly the arguments of ``mx.fast.metal_kernel`` and
returns a callable with the same keyword arguments, so a kernel factory can be handed either. A
call regenerates MLX's wrapper source (``wrapper.py``), compiles it as freestanding C++ against
``shim.h`` with g++ (or clang++), links the fiber runtime (``runtime.cpp``) and runs the grid.
Outputs start as 0xFF bytes (NaN) unless ``init_value`` is given; every buffer has guard zones
(reads past the end see NaN, writes past the end of an output are reported).

It lives in tests/support/ because the kernel tests and benchmarks/kernel_bytes.py all run
kernels through it; the emulator's own tests are in tests/msl/.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from tests.support.msl import strict
from tests.support.msl.wrapper import GeneratedKernel, InputSpec, generate

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
GUARD = 4096  # bytes of 0xFF before and after every buffer
ORDERS = {"forward": 0, "reverse": 1, "random": 2}

_NP_DTYPES: dict[mx.Dtype, np.dtype] = {
    mx.float32: np.dtype(np.float32),
    mx.float16: np.dtype(np.float16),
    mx.bfloat16: np.dtype(np.uint16),  # carried as raw bits
    mx.int32: np.dtype(np.int32),
    mx.uint32: np.dtype(np.uint32),
    mx.int64: np.dtype(np.int64),
    mx.int16: np.dtype(np.int16),
    mx.uint16: np.dtype(np.uint16),
    mx.int8: np.dtype(np.int8),
    mx.uint8: np.dtype(np.uint8),
    mx.bool_: np.dtype(np.bool_),
}


class MSLError(RuntimeError):
    """A kernel failed to build or misbehaved at run time (the message names the source line)."""


@dataclass
class Dispatch:
    """What one emulated dispatch did, for tests and the bytes benchmark."""

    name: str
    threadgroups: int
    threadgroup_memory: int
    bytes_read: int


def compiler() -> str:
    for cxx in (os.environ.get("CXX"), "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    raise MSLError("the MSL emulator needs a C++ compiler: install g++ or clang++ (apt-get g++)")


def _cache_dir() -> Path:
    path = Path(os.environ.get("MSLEMU_CACHE", Path(tempfile.gettempdir()) / "mslemu-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _known_files() -> dict[str, str]:
    """Text -> repository path of every kernel source, so compile errors point into the file."""
    files = {}
    for folder in (REPO / "macbatch" / "metal",):
        for path in sorted(folder.glob("*")):
            if path.suffix in (".metal", ".h"):
                files[path.read_text()] = str(path.relative_to(REPO))
    return files


_TG_DECL = re.compile(
    r"\bthreadgroup\s+([A-Za-z_][\w:]*(?:<[^;>]*>)?)\s+([A-Za-z_]\w*)\s*((?:\[[^\]]+\])+)\s*;"
)
_TG_SCALAR = re.compile(r"\bthreadgroup\s+[A-Za-z_][\w:]*(?:<[^;>]*>)?\s+[A-Za-z_]\w*\s*[;=(]")


def rewrite_threadgroup_arrays(body: str, origin: str) -> str:
    """``threadgroup T x[N];`` -> storage shared by the threadgroup (the only source rewrite)."""
    counter = iter(range(1_000_000))

    def repl(m: re.Match[str]) -> str:
        t, name, dims = m.group(1), m.group(2), m.group(3)
        line = body.count("\n", 0, m.start()) + 1
        return (
            f"{t} (&{name}){dims} = *reinterpret_cast<{t} (*){dims}>(mslemu_tg_array("
            f'{next(counter)}, sizeof({t}{dims}), "{name}", "{origin}", {line}));'
        )

    out = _TG_DECL.sub(repl, body)
    bad = _TG_SCALAR.search(out)
    if bad:
        line = out.count("\n", 0, bad.start()) + 1
        raise MSLError(
            f"{origin}:{line}: threadgroup variable that is not an array: the emulator would make "
            "it per-thread; declare it as an array (threadgroup T x[1];)"
        )
    return out


def _driver(gen: GeneratedKernel) -> str:
    """The C++ entry that calls the kernel with one thread's buffers and attributes."""
    args = []
    slot = 0
    for p in gen.params:
        if p.kind == "attribute":
            if p.ctype == "uint3":
                args.append(f"uint3{{info->{p.name}[0], info->{p.name}[1], info->{p.name}[2], 0u}}")
            else:
                args.append(f"info->{p.name}")
            continue
        const = "const " if p.kind != "output" else ""
        if p.kind == "input" and p.scalar:
            args.append(f"*static_cast<const {p.ctype}*>(buffers[{slot}])")
        elif p.kind in ("input", "output"):
            args.append(f"static_cast<{const}{p.ctype}*>(buffers[{slot}])")
        elif p.kind == "ndim":
            args.append(f"*static_cast<const int*>(buffers[{slot}])")
        else:
            ctype = "int" if p.kind == "shape" else "int64_t"
            args.append(f"static_cast<const {ctype}*>(buffers[{slot}])")
        slot += 1
    call = gen.name + (f"<{', '.join(gen.template_values)}>" if gen.template_values else "")
    return (
        '\n#line 1 "<emulator driver>"\n'
        'extern "C" void mslemu_thread_entry(void** buffers, const mslemu_thread_info* info) {\n'
        f"  {call}({', '.join(args)});\n}}\n"
    )


def compile_unit(gen: GeneratedKernel, header: str, body: str, strict_mode: bool) -> str:
    """The C++ translation unit: shim, poison list, #line-marked header, wrapper, body, driver."""
    files = _known_files()
    header_origin = files.get(header, "<header>")
    body_origin = files.get(body, "<kernel body>")
    start = len(header)
    body_at = gen.source.index(body, start)
    signature = gen.source[start:body_at]
    tail = gen.source[body_at + len(body) :]
    text = '#include "shim.h"\n'
    if strict_mode:
        text += strict.POISON
    text += f'#line 1 "{header_origin}"\n{header}\n'
    text += f'#line 1 "<MLX wrapper>"\n{signature}'
    text += f'#line 1 "{body_origin}"\n{rewrite_threadgroup_arrays(body, body_origin)}'
    text += f'\n#line 1 "<MLX wrapper end>"\n{tail}'
    return text + _driver(gen)


class _Library:
    """One compiled kernel variant, loaded with ctypes."""

    def __init__(self, path: Path) -> None:
        self._lib = ctypes.CDLL(str(path))
        self.launch = self._lib.mslemu_launch
        self.launch.restype = ctypes.c_int


def _runtime_object(cxx: str) -> Path:
    src = (HERE / "runtime.cpp").read_bytes() + (HERE / "abi.h").read_bytes()
    key = hashlib.sha256(src + cxx.encode()).hexdigest()[:16]
    obj = _cache_dir() / f"runtime-{key}.o"
    if not obj.exists():
        _run([cxx, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-c",
              str(HERE / "runtime.cpp"), "-o", str(obj) + ".tmp"], "runtime.cpp")  # fmt: skip
        os.replace(str(obj) + ".tmp", obj)
    return obj


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise MSLError(f"building {what} failed:\n{proc.stderr.strip()}")
    return proc.stdout


_LIBRARIES: dict[str, _Library] = {}


def build(unit: str, defines: tuple[str, ...], strict_mode: bool) -> _Library:
    cxx = compiler()
    flags = [
        "-std=c++17", "-O1", "-fPIC", "-fvisibility=hidden", "-nostdinc", "-ffreestanding",
        "-fno-exceptions", "-fno-rtti", "-Wno-attributes", "-fsingle-precision-constant",
        f"-I{HERE}", *(f"-D{d}" for d in defines),
    ]  # fmt: skip
    if strict_mode:
        flags += strict.FLAGS
    key = hashlib.sha256((unit + " ".join(flags) + cxx).encode()).hexdigest()[:20]
    key += hashlib.sha256((HERE / "shim.h").read_bytes()).hexdigest()[:8]
    if key in _LIBRARIES:
        return _LIBRARIES[key]
    cache = _cache_dir()
    lib = cache / f"kernel-{key}.so"
    if not lib.exists():
        work = Path(tempfile.mkdtemp(dir=cache))
        try:
            (work / "kernel.cpp").write_text(unit)
            _run([cxx, *flags, "-c", "kernel.cpp", "-o", "kernel.o"], "the kernel", cwd=work)
            if strict_mode:
                strict.check_object(work, cxx)
            runtime = _runtime_object(cxx)
            _run([cxx, "-shared", "kernel.o", str(runtime), "-o", "k.so", "-lm"], "link", work)
            os.replace(work / "k.so", lib)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _LIBRARIES[key] = _Library(lib)
    return _LIBRARIES[key]


def _to_bytes(x: mx.array) -> np.ndarray:
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.ascontiguousarray(np.array(x)).reshape(-1).view(np.uint8)


def _guarded(nbytes: int, fill: bytes | None = None) -> np.ndarray:
    buf = np.full(nbytes + 2 * GUARD, 0xFF, dtype=np.uint8)
    if fill is not None:
        buf[GUARD : GUARD + nbytes] = np.frombuffer(fill, dtype=np.uint8)
    return buf


@dataclass
class Emulator:
    """Factory of emulated kernels. ``order`` sets the lane order between sync points."""

    order: str = "forward"
    strict: bool = True
    count_bytes: bool = True
    seed: int = 0
    dispatches: list[Dispatch] = field(default_factory=list)

    def metal_kernel(
        self,
        name: str,
        input_names: list[str],
        output_names: list[str],
        source: str,
        header: str = "",
        ensure_row_contiguous: bool = True,
        atomic_outputs: bool = False,
        compile_options: dict[str, Any] | None = None,
    ) -> EmulatedKernel:
        if not output_names:
            raise ValueError("[metal_kernel] Must specify at least one output.")
        return EmulatedKernel(
            self, name, list(input_names), list(output_names), source, header, atomic_outputs
        )


@dataclass
class EmulatedKernel:
    emulator: Emulator
    name: str
    input_names: list[str]
    output_names: list[str]
    source: str
    header: str
    atomic_outputs: bool

    def __call__(
        self,
        *,
        inputs: list[Any],
        output_shapes: list[tuple[int, ...]],
        output_dtypes: list[mx.Dtype],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        template: list[tuple[str, Any]] | None = None,
        init_value: float | None = None,
        verbose: bool = False,
        stream: Any = None,
    ) -> list[mx.array]:
        if len(inputs) != len(self.input_names):
            raise ValueError(
                f"[metal_kernel] Expected `inputs` to have size {len(self.input_names)} "
                f"but got size {len(inputs)}."
            )
        arrays = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        specs = [InputSpec(a.dtype, a.ndim, a.size) for a in arrays]
        gen = generate(
            self.name, self.input_names, self.output_names, self.source, self.header, specs,
            list(output_dtypes), list(template or []), self.atomic_outputs,
        )  # fmt: skip
        if verbose:
            print(f"Generated source code for `{self.name}`:\n```\n{gen.source}\n```")
        em = self.emulator
        defines = ("MSLEMU_COUNT_BYTES",) if em.count_bytes else ()
        lib = build(compile_unit(gen, self.header, self.source, em.strict), defines, em.strict)

        keep: list[np.ndarray] = []
        pointers: list[int] = []

        def add(buf: np.ndarray) -> None:
            keep.append(buf)
            pointers.append(buf.ctypes.data + GUARD)

        for p in gen.params:
            if p.kind == "attribute":
                continue
            if p.kind in ("input",):
                add(_guarded(arrays[p.index].nbytes, _to_bytes(arrays[p.index]).tobytes()))
            elif p.kind == "shape":
                add(_guarded(4 * 8, np.array(arrays[p.index].shape, np.int32).tobytes()))
            elif p.kind == "strides":
                a = arrays[p.index]
                strides = np.cumprod((list(a.shape[1:]) + [1])[::-1])[::-1]
                add(_guarded(8 * len(strides), strides.astype(np.int64).tobytes()))
            elif p.kind == "ndim":
                add(_guarded(4, np.array([arrays[p.index].ndim], np.int32).tobytes()))
        outputs: list[tuple[np.ndarray, tuple[int, ...], mx.Dtype]] = []
        for shape, dtype in zip(output_shapes, output_dtypes, strict=True):
            npd = _NP_DTYPES[dtype]
            nbytes = int(np.prod(shape, dtype=np.int64)) * npd.itemsize
            fill = None
            if init_value is not None:
                fill = np.full(nbytes // npd.itemsize, init_value, dtype=_np_value_dtype(dtype))
                fill = _values_to_bits(fill, dtype).tobytes()
            buf = _guarded(nbytes, fill)
            add(buf)
            outputs.append((buf, tuple(shape), dtype))

        argv = (ctypes.c_void_p * len(pointers))(*pointers)
        grid3 = (ctypes.c_uint * 3)(*grid)
        tg3 = (ctypes.c_uint * 3)(*(min(t, g) for t, g in zip(threadgroup, grid, strict=True)))
        stats = (ctypes.c_ulong * 3)()
        err = ctypes.create_string_buffer(2048)
        rc = lib.launch(argv, grid3, tg3, ORDERS[em.order], em.seed, stats, err, len(err))
        if rc:
            raise MSLError(f"kernel {self.name}: {err.value.decode()}")
        for i, (buf, _, _) in enumerate(outputs):
            if (buf[:GUARD] != 0xFF).any() or (buf[len(buf) - GUARD :] != 0xFF).any():
                raise MSLError(f"kernel {self.name}: write outside output '{self.output_names[i]}'")
        em.dispatches.append(Dispatch(self.name, stats[0], stats[1], stats[2]))
        return [_from_bytes(buf[GUARD : len(buf) - GUARD], s, d) for buf, s, d in outputs]


def _np_value_dtype(dtype: mx.Dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == mx.bfloat16 else _NP_DTYPES[dtype]


def _values_to_bits(values: np.ndarray, dtype: mx.Dtype) -> np.ndarray:
    if dtype != mx.bfloat16:
        return values
    return np.array(mx.array(values).astype(mx.bfloat16).view(mx.uint16))


def _from_bytes(raw: np.ndarray, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    arr = mx.array(raw.view(_NP_DTYPES[dtype]).reshape(shape))
    return arr.view(mx.bfloat16) if dtype == mx.bfloat16 else arr
