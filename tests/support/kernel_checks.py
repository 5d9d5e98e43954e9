"""Every attention path on one `Case` against the float64 numpy oracle (shared by the sparse and
two-source tests): the emulated Metal kernel and the CPU kernel on poisoned pages, the reference
on finite ones."""

from __future__ import annotations

from macbatch.metal import AttentionBackend, paged_attention_reference
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.kernels import SplitPolicy
from tests.support.attention_cases import TOLERANCE, Case, emulated_attention, relative_error


class CpuKernel(AttentionBackend):
    """The CPU kernel as a backend object, called directly (no registry, no self-test)."""

    name = "cpu-test"
    label = "CPU kernel"
    __call__ = staticmethod(paged_attention_cpu)


def kernel_backends(split: SplitPolicy | None = None) -> dict[str, AttentionBackend]:
    return {"metal": emulated_attention(split=split), "cpu": CpuKernel()}


def check_backends(case: Case, split: SplitPolicy | None = None) -> None:
    """The kernels on poisoned pages and the reference on finite ones all match numpy. The CPU
    kernel's dense path reads whole pages and masks (its own tests give it finite pages), so a
    case without a token list gives it finite token pages; its second source stays poisoned."""
    want = case.oracle()
    tol = TOLERANCE[case.dtype]
    for name, backend in kernel_backends(split).items():
        dense_cpu = name == "cpu" and case.top_k is None
        got = backend(*case.args(poisoned=not dense_cpu, poison_rows=True))
        assert got.shape == case.out_shape and got.dtype == case.dtype
        assert relative_error(got, want) <= tol, f"{name}: {relative_error(got, want)}"
    ref = paged_attention_reference(*case.args(poisoned=False))
    assert relative_error(ref, want) <= tol, f"reference: {relative_error(ref, want)}"
