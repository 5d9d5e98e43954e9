"""The emulator can fail: each planted bug is caught, with the source line where it applies."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal import kernels
from tests.support.attention_cases import TOLERANCE, Case, relative_error
from tests.support.attention_numpy import paged_attention_numpy
from tests.support.msl.emulator import Emulator, MSLError

KERNEL = (kernels.HERE / "paged_attention.metal").read_text()
CASE = Case([23, 40, 9], [1, 5, 9])


def _mutant_error(old: str, new: str, order: str = "forward") -> float:
    """Relative error of the real kernel with one source edit, on poisoned pages."""
    assert KERNEL.count(old) == 1, old
    emulator = Emulator(order)
    real_factory = emulator.metal_kernel

    def factory(**kw):
        kw["source"] = kw["source"].replace(old, new)
        return real_factory(**kw)

    got = kernels.paged_attention_kernel(*CASE.args(poisoned=True), metal_kernel=factory)
    want = paged_attention_numpy(
        CASE.q, CASE.k, CASE.v, CASE.tables, CASE.lens, CASE.cu, CASE.scale
    )
    return relative_error(got, want)


def test_unmodified_kernel_passes():
    assert _mutant_error("c < k_end; c += TK", "c < k_end; c += TK") <= TOLERANCE[mx.float32]


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_missing_barrier_is_caught(order):
    """Without the barrier after the K/V loads, lanes read poisoned threadgroup memory."""
    loaded = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n\n  for (int j = 0;"
    assert _mutant_error(loaded, "\n\n  for (int j = 0;", order) == float("inf")


def test_off_by_one_bound_is_caught():
    """Loading one key past the context reads a poisoned slot."""
    assert _mutant_error("key >= k_begin && key < k_end;", "key >= k_begin && key <= k_end;") > 1


def test_unwritten_output_element_is_caught():
    edit = ("      if (d < D) {\n        out[", "      if (d < D - 1) {\n        out[")
    assert _mutant_error(*edit) == float("inf")


def _run(body: str, threads: int = 64, group: int = 64, emulator: Emulator | None = None):
    kernel = (emulator or Emulator()).metal_kernel(
        name="probe", input_names=["a"], output_names=["out"], source=body
    )
    return kernel(
        inputs=[mx.arange(threads, dtype=mx.float32)],
        output_shapes=[(threads,)],
        output_dtypes=[mx.float32],
        grid=(threads, 1, 1),
        threadgroup=(group, 1, 1),
    )[0]


def test_clean_probe_runs():
    body = """
    threadgroup float t[64];
    uint i = thread_index_in_threadgroup;
    t[i] = a[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = simd_sum(t[63 - i]);
    """
    want = np.repeat([np.arange(32, 64).sum(), np.arange(32).sum()], 32)
    np.testing.assert_array_equal(np.array(_run(body)), want)


def test_barrier_in_divergent_control_flow():
    body = """
    if (simdgroup_index_in_threadgroup == 0) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[thread_position_in_grid.x] = a[thread_position_in_grid.x];
    """
    with pytest.raises(MSLError, match=r"threadgroup_barrier at <kernel body>:3 reached by 32"):
        _run(body)


def test_barriers_at_different_lines():
    body = """
    if (thread_index_in_threadgroup < 40) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[thread_position_in_grid.x] = 0;
    """
    with pytest.raises(MSLError, match=r"barrier divergence.*:3.*:5"):
        _run(body)


def test_simd_call_on_some_lanes_only():
    body = """
    float x = a[thread_position_in_grid.x];
    if (thread_index_in_simdgroup < 16) {
      x = simd_max(x);
    }
    out[thread_position_in_grid.x] = x;
    """
    with pytest.raises(MSLError, match=r"simd_max at <kernel body>:4.*returned without"):
        _run(body)


def test_threadgroup_memory_limit():
    body = """
    threadgroup float big[9000];
    big[thread_index_in_threadgroup] = 1.0f;
    out[thread_position_in_grid.x] = big[0];
    """
    with pytest.raises(MSLError, match="threadgroup memory over 32768 bytes: 'big'"):
        _run(body)


def test_threadgroup_array_overflow_write():
    body = """
    threadgroup float t[64];
    t[thread_index_in_threadgroup + 1] = 1.0f;
    out[thread_position_in_grid.x] = 0;
    """
    with pytest.raises(MSLError, match="write outside threadgroup array 't'"):
        _run(body)


def test_output_overflow_write():
    with pytest.raises(MSLError, match="write outside output 'out'"):
        _run("out[thread_position_in_grid.x + 1] = 0;")


def test_threadgroup_scalar_is_refused():
    with pytest.raises(MSLError, match=r"<kernel body>:2: threadgroup variable that is not"):
        _run("\nthreadgroup float total;\nout[0] = 0;")


@pytest.mark.parametrize(
    "body,message",
    [
        ("double x = a[0]; out[0] = x;", "double"),
        ("std::size_t n = 0; out[0] = n;", "std"),
        ("float* p = new float[2]; out[0] = p[0];", "new"),
        ("int n = int(a[0]) + 1; float v[n]; v[0] = 1; out[0] = v[0];", "variable length"),
        ("static float keep = 0; keep += 1; out[0] = keep;", "writable static data"),
    ],
)
def test_strict_mode_rejects_what_msl_forbids(body, message):
    with pytest.raises(MSLError, match=message):
        _run(body)


def test_strict_mode_finds_recursion():
    emulator = Emulator()
    kernel = emulator.metal_kernel(
        name="rec",
        input_names=["a"],
        output_names=["out"],
        header="inline int fact(int n) { return n < 2 ? 1 : n * fact(n - 1); }\n",
        source="out[thread_position_in_grid.x] = fact(int(a[0]) + 3);",
    )
    with pytest.raises(MSLError, match=r"recursion: fact\(int\) -> fact"):
        kernel(inputs=[mx.ones(4)], output_shapes=[(4,)], output_dtypes=[mx.float32],
               grid=(4, 1, 1), threadgroup=(4, 1, 1))  # fmt: skip


def test_compile_error_points_into_the_metal_file():
    emulator = Emulator()
    kernel = emulator.metal_kernel(
        name="bad", input_names=["a"], output_names=["out"], source=KERNEL + "\nundeclared();\n",
        header=(kernels.HERE / "paged_attention.h").read_text(),
    )  # fmt: skip
    with pytest.raises(MSLError, match=r"<kernel body>:\d+.*undeclared"):
        kernel(inputs=[mx.ones(4)], output_shapes=[(4,)], output_dtypes=[mx.float32],
               grid=(4, 1, 1), threadgroup=(4, 1, 1))  # fmt: skip
