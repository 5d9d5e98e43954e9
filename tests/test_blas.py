"""Which OpenBLAS the command line preloads on Linux (macbatch/blas.py, issue 65): the system's,
else the cmeel-openblas wheel's after a child process has multiplied with it; a library that
cannot run here is refused with the reason, and doctor says which BLAS is in use."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from macbatch import blas

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux's")


def test_none_preloads_nothing_and_says_so(monkeypatch):
    monkeypatch.setenv(blas.CHOICE_VARIABLE, "none")
    chosen = blas.choose()
    assert chosen.path is None and "reference BLAS" in chosen.description
    monkeypatch.setenv(blas.CHOICE_VARIABLE, "fast")
    assert "is none of" in blas.choose().description


def test_the_probe_refuses_what_is_no_blas_and_takes_an_openblas(tmp_path):
    assert "cannot open shared object" in (blas.probe(tmp_path / "missing.so") or "")
    libm = ctypes.util.find_library("m")  # loads, but has no BLAS in it
    assert "cblas_sgemm" in (blas.probe(libm) or "")
    for found in (blas.system_openblas(), blas.wheel_openblas()):
        if found is not None and found.exists():
            assert blas.probe(found) is None  # 64x64 ones times ones is 64 everywhere


def test_the_wheel_is_chosen_when_the_system_has_none(monkeypatch):
    wheel = blas.wheel_openblas()
    if wheel is None:
        pytest.skip("the cmeel-openblas wheel is not installed here")
    monkeypatch.setenv(blas.CHOICE_VARIABLE, "wheel")  # as if the system had none
    chosen = blas.choose()
    assert chosen.path == wheel or "does not run here" in chosen.description


def test_the_test_script_preloads_what_the_command_line_would(monkeypatch):
    for choice in ("auto", "none"):
        monkeypatch.setenv(blas.CHOICE_VARIABLE, choice)
        printed = subprocess.run(
            [sys.executable, "-m", "macbatch.blas"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert printed == str(blas.choose().path or "")


def test_doctor_names_the_blas_in_use(monkeypatch):
    from macbatch.commands.doctor import _blas

    monkeypatch.setenv("LD_PRELOAD", "/opt/x/libopenblas.so.0")
    assert _blas() == "OpenBLAS preloaded (/opt/x/libopenblas.so.0)"
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setenv(blas.CHOICE_VARIABLE, "none")
    assert _blas().startswith("MLX's reference BLAS (slow)")
