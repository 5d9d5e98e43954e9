"""The attention backends by name, and the one place that decides which of them runs.

``MACBATCH_ATTENTION`` names a registered backend, or ``auto`` (the default). ``auto`` takes the
first backend, in registry order, that this machine can run (`available`), that builds
(`prepare`) and that passes its self-test against the reference (``selftest.py``); the reference,
last, needs no test (it is the oracle) and always runs. A backend named explicitly is used even
when its self-test failed (for debugging a kernel), as long as it can run here at all; one that
cannot, or an unknown name, logs a warning and ``auto`` decides.

The decision is made by `ensure_selftest` (the engine calls it once at start) and kept in
`selection`; until then the reference serves. So ``macbatch.metal.paged_attention``, called once
per layer per step, reads neither the environment nor any table: one attribute and a call.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from macbatch.metal.backend import AttentionBackend, BackendUnavailable
from macbatch.metal.cpu_kernel import CpuKernelBackend
from macbatch.metal.kernels import MetalKernelBackend
from macbatch.metal.reference import ReferenceBackend
from macbatch.metal.selftest import selftest

log = logging.getLogger(__name__)
ENV = "MACBATCH_ATTENTION"
AUTO = "auto"
FALLBACK = ReferenceBackend.name

# Auto's order of preference; adding a backend is one file and one line here.
BACKENDS: dict[str, AttentionBackend] = {
    backend.name: backend
    for backend in (
        MetalKernelBackend(),
        CpuKernelBackend(),
        ReferenceBackend(),  # last: auto never looks past the reference
    )
}
# Names earlier releases documented, still honoured so a set variable keeps meaning the same.
RENAMED = {"kernel": MetalKernelBackend.name}


@dataclass(frozen=True)
class Verdict:
    """What the start-up checks found out about one backend on this machine."""

    runs: bool  # `prepare` succeeded: the backend can be called here
    failure: str | None = None  # why auto does not use it; None: built and self-test passed


@dataclass
class Selection:
    """Which backend `paged_attention` calls and why; changed only by `ensure_selftest`."""

    backend: AttentionBackend = field(default_factory=ReferenceBackend)
    requested: str | None = None  # the name honoured, or AUTO; None: nothing selected yet
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by backend name


selection = Selection()


def ensure_selftest() -> None:
    """Select the backend ``MACBATCH_ATTENTION`` asks for, building and self-testing each
    candidate the first time it is needed (results are kept, so later calls are cheap)."""
    name = _requested()
    if name != AUTO and not _can_force(BACKENDS[name]):
        name = AUTO
    selection.backend = _first_proven() if name == AUTO else BACKENDS[name]
    selection.requested = name


def attention_backend() -> str:
    """Which backend `paged_attention` calls now, and why, in words (``macbatch doctor``)."""
    backend, requested = selection.backend, selection.requested
    if requested is None:
        return f"{backend.label} (start-up self-test pending)"
    if requested != AUTO:
        failure = selection.verdicts.get(backend.name, Verdict(True)).failure
        return f"{backend.label} (forced by {ENV}{f'; {failure}' if failure else ''})"
    if backend.name != FALLBACK:
        return f"{backend.label} (self-test passed)"
    reasons = [
        f"{b.label} {verdict.failure}"
        for b in BACKENDS.values()
        if (verdict := selection.verdicts.get(b.name)) and verdict.failure
    ]
    return f"{backend.label} ({'; '.join(reasons) or 'no kernel can run here'})"


def cpu_kernel_status() -> str:
    """Whether the C++ CPU kernel is built and proved by its self-test, in words."""
    cpu = BACKENDS[CpuKernelBackend.name]
    unusable = cpu.available()
    if unusable is not None:
        return f"not used ({unusable})"
    verdict = selection.verdicts.get(cpu.name)
    if verdict is None:
        return "not checked yet"
    return verdict.failure or "built, self-test passed"


def _requested() -> str:
    value = os.environ.get(ENV, "").strip().lower() or AUTO
    value = RENAMED.get(value, value)
    if value == AUTO or value in BACKENDS:
        return value
    names = ", ".join([AUTO, *BACKENDS])
    log.warning("%s=%r is not a registered attention backend (%s); using auto", ENV, value, names)
    return AUTO


def _can_force(backend: AttentionBackend) -> bool:
    """Whether a backend named explicitly can run here; a failed self-test only warns."""
    why = backend.available()
    if why is None:
        verdict = _verdict(backend)
        if verdict.runs:
            if verdict.failure:
                log.warning("attention backend %r used anyway: forced by %s", backend.name, ENV)
            return True
        why = verdict.failure
    log.warning("%s=%s cannot run here (%s); using auto", ENV, backend.name, why)
    return False


def _first_proven() -> AttentionBackend:
    for backend in BACKENDS.values():
        if backend.name == FALLBACK:
            break
        if backend.available() is None and _verdict(backend).failure is None:
            return backend
    return BACKENDS[FALLBACK]


def _verdict(backend: AttentionBackend) -> Verdict:
    """The backend's build and self-test on this machine, run the first time they are needed."""
    verdict = selection.verdicts.get(backend.name)
    if verdict is None:
        verdict = selection.verdicts[backend.name] = _check(backend)
        if verdict.failure:
            log.warning("attention backend %r %s", backend.name, verdict.failure)
    return verdict


def _check(backend: AttentionBackend) -> Verdict:
    if backend.name == FALLBACK:  # the oracle: compared with itself it would prove nothing
        return Verdict(runs=True)
    try:
        backend.prepare()
    except BackendUnavailable as exc:  # never stop the engine: another backend serves
        first_line = str(exc).partition("\n")[0]
        return Verdict(runs=False, failure=f"unavailable: {first_line}")
    ok, why = selftest(backend)
    return Verdict(runs=True, failure=None if ok else f"self-test failed: {why}")
