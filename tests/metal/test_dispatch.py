"""Which attention path runs, the start-up self-test, and the fallback to the reference."""

from __future__ import annotations

import functools
import logging

import mlx.core as mx
import pytest

import macbatch.metal as metal
from macbatch.metal import kernels
from tests.metal.cases import Case, emulated_attention
from tests.msl.emulator import Emulator


@pytest.fixture
def fresh_state(monkeypatch):
    for key, value in (("kernel_ok", None), ("why", ""), ("cpu_ok", None), ("cpu_why", "")):
        monkeypatch.setitem(metal._state, key, value)
    monkeypatch.delenv(metal.ENV, raising=False)
    return monkeypatch


def _broken_kernel():
    """The real kernel with the softcap applied twice: wrong only when a softcap is set."""
    factory = Emulator().metal_kernel

    def mutated(**kw):
        kw["source"] = kw["source"].replace("soft_cap(dot,", "soft_cap(2.0f * dot,")
        return factory(**kw)

    return functools.partial(kernels.paged_attention_kernel, metal_kernel=mutated)


def test_without_metal_the_cpu_kernel_runs_once_proven(fresh_state):
    case = Case([5, 12], [1, 4])
    reference = metal.paged_attention_reference(*case.args(poisoned=False))
    assert metal.attention_backend() == "reference (no Metal; CPU kernel self-test pending)"
    assert mx.array_equal(metal.paged_attention(*case.args(poisoned=False)), reference)
    metal.ensure_selftest()
    assert metal._state["kernel_ok"] is None  # the Metal kernel is never tried here
    assert metal.attention_backend() == "CPU kernel (no Metal)"
    got = metal.paged_attention(*case.args(poisoned=False))
    assert mx.array_equal(got, metal.paged_attention_cpu(*case.args(poisoned=False)))
    assert mx.allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_without_a_cpu_kernel_the_reference_runs(fresh_state, caplog):
    def unavailable():
        raise metal.CpuKernelUnavailable("no C++ compiler found (install g++ or set CXX)")

    fresh_state.setattr(metal, "load_extension", unavailable)
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert "CPU attention kernel disabled" in caplog.text
    assert metal.attention_backend() == (
        "reference (no Metal; CPU kernel unavailable: no C++ compiler found (install g++ or set "
        "CXX))"
    )
    case = Case([5, 12], [1, 4])
    got = metal.paged_attention(*case.args(poisoned=False))
    assert mx.array_equal(got, metal.paged_attention_reference(*case.args(poisoned=False)))


def test_environment_forces_reference(fresh_state):
    fresh_state.setenv(metal.ENV, "reference")
    assert metal.attention_backend() == "reference (forced by MACBATCH_ATTENTION)"


def test_selftest_passes_with_the_emulated_kernel():
    assert metal.selftest(emulated_attention()) == (True, "")


def test_selftest_catches_a_wrong_kernel():
    ok, why = metal.selftest(_broken_kernel())
    assert not ok and "max error" in why and "softcap" in why


def test_selftest_catches_a_compile_error():
    def no_compiler(**kw):
        kw["source"] += "\nnot_msl(;\n"
        return Emulator().metal_kernel(**kw)

    ok, why = metal.selftest(
        functools.partial(kernels.paged_attention_kernel, metal_kernel=no_compiler)
    )
    assert not ok and why.startswith("MSLError: building the kernel failed")


def test_failed_selftest_on_metal_falls_back_to_reference(fresh_state, caplog):
    """On a Mac whose kernel misbehaves: a warning, the reference, never wrong output."""
    fresh_state.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh_state.setattr(metal, "paged_attention_kernel", _broken_kernel())
    assert metal.attention_backend() == "kernel (Metal, self-test pending)"
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert "Metal attention kernel disabled" in caplog.text
    assert metal.attention_backend().startswith("reference (kernel self-test failed: ")
    case = Case([9, 3], [2, 1], softcap=5.0)
    got = metal.paged_attention(*case.args(poisoned=False), **case.options())
    want = metal.paged_attention_reference(*case.args(poisoned=False), **case.options())
    assert mx.array_equal(got, want)


def test_passed_selftest_on_metal_uses_the_kernel(fresh_state):
    emulator = Emulator()
    fresh_state.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh_state.setattr(metal, "paged_attention_kernel", emulated_attention(emulator))
    metal.ensure_selftest()
    assert metal.attention_backend() == "kernel (Metal)"
    before = len(emulator.dispatches)
    case = Case([9, 3], [2, 1])
    metal.paged_attention(*case.args(poisoned=True))
    assert len(emulator.dispatches) == before + 1


def test_forced_kernel_on_metal_runs_even_after_a_failed_selftest(fresh_state):
    """MACBATCH_ATTENTION=kernel is for debugging a kernel the self-test rejected."""
    emulator = Emulator()
    fresh_state.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh_state.setattr(metal, "paged_attention_kernel", emulated_attention(emulator))
    fresh_state.setitem(metal._state, "kernel_ok", False)
    fresh_state.setenv(metal.ENV, "kernel")
    assert metal.attention_backend() == "kernel (Metal, forced by MACBATCH_ATTENTION)"
    before = len(emulator.dispatches)
    metal.paged_attention(*Case([9, 3], [2, 1]).args(poisoned=True))
    assert len(emulator.dispatches) == before + 1
