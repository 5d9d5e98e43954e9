"""Shared fixtures: tiny models written to disk once per session, the app's data directory kept
private, and `macbatch run` called in-process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from tests.support.tiny import save_model


@pytest.fixture(scope="session", autouse=True)
def private_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The app's data directory (history, ledgers, serve's records, the KV disk tier) in a
    temporary folder for the whole session, never the user's: the disk tier is on by default in
    the front ends, and blocks one run left behind would turn the next run's prefills into
    disk reads. Tests that need their own folder set ``MACBATCH_HOME`` themselves."""
    before = os.environ.get("MACBATCH_HOME")
    os.environ["MACBATCH_HOME"] = str(tmp_path_factory.mktemp("macbatch-home"))
    yield
    if before is None:
        os.environ.pop("MACBATCH_HOME", None)
    else:
        os.environ["MACBATCH_HOME"] = before


@pytest.fixture(autouse=True)
def stop_signals_restored() -> Iterator[None]:
    """`macbatch run` ignores Ctrl-C and SIGTERM once its files are final, until its process
    exits (run_guard.caught_signals); run in-process, the suite goes on, and gets them back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def attention_kernel_ready() -> None:
    """Build and prove this machine's attention kernel once, before any test runs: on a fresh
    machine the CPU kernel's first build takes ~15 s, which must not land inside a test that
    waits for a model to load with a deadline."""
    import macbatch.metal

    macbatch.metal.ensure_selftest()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random qwen3 model with a real tokenizer, in Hugging Face layout."""
    return save_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", arch="qwen3")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: Path):
    """The tiny models' tokenizer, as mlx-lm loads it (a TokenizerWrapper)."""
    from mlx_lm import load

    return load(str(tiny_model_path))[1]


@pytest.fixture
def eager_speculation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests rest at most one step after drafts that failed or were never proposed: tests
    of exactness under verification must not leave to the policy's rests whether the random
    models' replies ever meet a verification (the rests have their own tests), nor to the
    step times measured on a busy machine whether drafting pays (no break-even is measured),
    nor to the requests before whether a new one starts drafting (no prior)."""
    from macbatch.engine.speculative import policy, step_costs

    monkeypatch.setattr(policy, "MAX_REST", 1)
    monkeypatch.setattr(policy, "MAX_IDLE_REST", 1)
    monkeypatch.setattr(policy, "PRIOR_WEIGHT", 0.0)
    monkeypatch.setattr(step_costs.StepCosts, "break_even", lambda self, batch: None)
    monkeypatch.setattr(step_costs.StepCosts, "wants_plain", lambda self, batch: False)


@pytest.fixture(scope="session")
def run_app() -> typer.Typer:
    """An app of `macbatch run` alone (the batch tests and the vision tests' image jobs both
    run it, hence here)."""
    from macbatch.batch.command import run_command

    app = typer.Typer()
    app.command()(run_command)
    return app


@pytest.fixture
def macbatch_run(run_app: typer.Typer):
    """Call `macbatch run ARGS...` in-process; returns click's Result (stdout, stderr, code)."""

    def invoke(*args: Any) -> Result:
        return CliRunner().invoke(run_app, [str(a) for a in args])

    return invoke
