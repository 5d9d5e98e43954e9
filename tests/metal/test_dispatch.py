"""Which attention backend runs, the start-up self-test, and the fallback to the reference."""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest

import macbatch.metal as metal
from macbatch.metal import cpu_kernel, registry
from macbatch.metal.kernels import MetalKernelBackend
from tests.support.attention_cases import Case, emulated_attention
from tests.support.msl.emulator import Emulator


@pytest.fixture
def fresh(monkeypatch):
    """Nothing selected or self-tested yet, no ``MACBATCH_ATTENTION``."""
    monkeypatch.setattr(registry, "selection", registry.Selection())
    monkeypatch.delenv(metal.ENV, raising=False)
    return monkeypatch


def _broken_kernel() -> MetalKernelBackend:
    """The real kernel with the softcap applied twice: wrong only when a softcap is set."""
    factory = Emulator().metal_kernel

    def mutated(**kw):
        kw["source"] = kw["source"].replace("soft_cap(dot,", "soft_cap(2.0f * dot,")
        return factory(**kw)

    return MetalKernelBackend(mutated)


class CountingReference(metal.AttentionBackend):
    """A backend added by a test: the reference, counting its calls."""

    name = "counting"
    label = "counting reference"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, q, k, v, meta, layer, /):
        self.calls += 1
        return metal.paged_attention_reference(q, k, v, meta, layer)


def test_without_metal_the_cpu_kernel_runs_once_proven(fresh):
    args = Case([5, 12], [1, 4]).args(poisoned=False)
    reference = metal.paged_attention_reference(*args)
    assert metal.attention_backend() == "reference (start-up self-test pending)"
    assert mx.array_equal(metal.paged_attention(*args), reference)
    metal.ensure_selftest()
    assert "metal" not in registry.selection.verdicts  # the Metal kernel is never tried here
    assert metal.attention_backend() == "CPU kernel (self-test passed)"
    assert metal.cpu_kernel_status() == "built, self-test passed"
    got = metal.paged_attention(*args)
    assert mx.array_equal(got, metal.paged_attention_cpu(*args))
    assert mx.allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_without_a_cpu_kernel_the_reference_runs(fresh, caplog):
    def unavailable():
        raise metal.CpuKernelUnavailable("no C++ compiler found (install g++ or set CXX)")

    fresh.setattr(cpu_kernel, "load_extension", unavailable)
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert "attention backend 'cpu' unavailable: no C++ compiler" in caplog.text
    why = "unavailable: no C++ compiler found (install g++ or set CXX)"
    assert metal.attention_backend() == f"reference (CPU kernel {why})"
    assert metal.cpu_kernel_status() == why
    args = Case([5, 12], [1, 4]).args(poisoned=False)
    assert mx.array_equal(metal.paged_attention(*args), metal.paged_attention_reference(*args))


def test_environment_forces_reference(fresh):
    fresh.setenv(metal.ENV, "reference")
    metal.ensure_selftest()
    assert metal.attention_backend() == "reference (forced by MACBATCH_ATTENTION)"
    assert list(registry.selection.verdicts) == ["reference"]  # no kernel built or tested
    assert metal.cpu_kernel_status() == "not checked yet"


def test_selftest_passes_with_the_emulated_kernel():
    assert metal.selftest(emulated_attention()) == (True, "")


def test_selftest_catches_a_wrong_kernel():
    ok, why = metal.selftest(_broken_kernel())
    assert not ok and "max error" in why and "softcap" in why


def test_selftest_catches_a_kernel_that_reads_latent_values_wrong():
    """The latent kernel with the values taken from the rows' trailing columns, not leading."""
    factory = Emulator().metal_kernel

    def mutated(**kw):
        kw["source"] = kw["source"].replace(
            "a += p[t] * rows[t * D + d];", "a += p[t] * rows[t * D + D - DV + d];"
        )
        return factory(**kw)

    ok, why = metal.selftest(MetalKernelBackend(mutated))
    assert not ok and "latent 96/64: max error" in why


def test_selftest_catches_a_compile_error():
    def no_compiler(**kw):
        kw["source"] += "\nnot_msl(;\n"
        return Emulator().metal_kernel(**kw)

    ok, why = metal.selftest(MetalKernelBackend(no_compiler))
    assert not ok and "pages plain: MSLError: building the kernel failed" in why


def test_failed_selftest_on_metal_falls_back_to_reference(fresh, caplog):
    """On a Mac whose kernel misbehaves: a warning, the reference, never wrong output."""
    fresh.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh.setitem(metal.BACKENDS, "metal", _broken_kernel())
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert "attention backend 'metal' self-test failed" in caplog.text
    assert metal.attention_backend().startswith("reference (Metal kernel self-test failed: ")
    assert metal.cpu_kernel_status() == "not used (Metal runs the Metal kernel)"
    args = Case([9, 3], [2, 1], softcap=5.0).args(poisoned=False)
    assert mx.array_equal(metal.paged_attention(*args), metal.paged_attention_reference(*args))


def test_passed_selftest_on_metal_uses_the_kernel(fresh):
    emulator = Emulator()
    fresh.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh.setitem(metal.BACKENDS, "metal", emulated_attention(emulator))
    metal.ensure_selftest()
    assert metal.attention_backend() == "Metal kernel (self-test passed)"
    before = len(emulator.dispatches)
    metal.paged_attention(*Case([9, 3], [2, 1]).args(poisoned=True))
    assert len(emulator.dispatches) == before + 1


def test_forced_kernel_runs_even_after_a_failed_selftest(fresh, caplog):
    """MACBATCH_ATTENTION=metal is for debugging a kernel the self-test rejected."""
    broken = _broken_kernel()
    fresh.setattr(metal.mx.metal, "is_available", lambda: True)
    fresh.setitem(metal.BACKENDS, "metal", broken)
    fresh.setenv(metal.ENV, "metal")
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert "used anyway: forced by MACBATCH_ATTENTION" in caplog.text
    assert metal.attention_backend().startswith(
        "Metal kernel (forced by MACBATCH_ATTENTION; self-test failed: "
    )
    assert registry.selection.backend is broken


def test_a_registered_backend_is_selectable_by_name(fresh):
    backend = CountingReference()
    fresh.setitem(metal.BACKENDS, backend.name, backend)
    fresh.setenv(metal.ENV, "counting")
    metal.ensure_selftest()
    assert metal.attention_backend() == "counting reference (forced by MACBATCH_ATTENTION)"
    assert registry.selection.verdicts["counting"] == registry.Verdict(runs=True)  # self-tested
    args = Case([9, 3], [2, 1], sliding_window=4, sinks=True).args(poisoned=False)
    calls = backend.calls
    assert mx.array_equal(metal.paged_attention(*args), metal.paged_attention_reference(*args))
    assert backend.calls == calls + 1


def test_auto_takes_the_first_proven_backend_in_registry_order(fresh):
    backend = CountingReference()
    fresh.setattr(registry, "BACKENDS", {backend.name: backend, **registry.BACKENDS})
    metal.ensure_selftest()
    assert metal.attention_backend() == "counting reference (self-test passed)"
    assert "cpu" not in registry.selection.verdicts  # never needed


@pytest.mark.parametrize(
    "value,warning",
    [
        (
            "nonesuch",
            "'nonesuch' is not a registered attention backend (auto, metal, cpu, reference",
        ),
        ("metal", "MACBATCH_ATTENTION=metal cannot run here (no Metal); using auto"),
    ],
)
def test_an_unknown_or_unusable_name_warns_and_auto_decides(fresh, caplog, value, warning):
    fresh.setattr(metal.mx.metal, "is_available", lambda: False)
    fresh.setenv(metal.ENV, value)
    with caplog.at_level(logging.WARNING, logger="macbatch.metal"):
        metal.ensure_selftest()
    assert warning in caplog.text
    assert registry.selection.requested == registry.AUTO
    assert "forced" not in metal.attention_backend()
