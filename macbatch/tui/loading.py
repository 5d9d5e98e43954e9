"""Loading the model on the engine thread while the UI shows how far it got.

The loader runs on the engine thread (all MLX work lives there); it records its progress in a
`LoadProgress`, which the UI polls on a timer, so neither side calls into the other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from macbatch.engine import Engine, EngineConfig


@dataclass(frozen=True)
class LoadState:
    """One reading of the progress: what is happening, and how many of how many units."""

    phase: str
    done: float = 0
    total: float | None = None


class LoadProgress:
    """Thread-safe progress written by the loader and read by the UI."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = LoadState("starting")

    def update(self, phase: str, done: float = 0, total: float | None = None) -> None:
        with self._lock:
            self._state = LoadState(phase, done, total)

    def read(self) -> LoadState:
        with self._lock:
            return self._state


def is_hub_id(model: str) -> bool:
    """True for "owner/name" that is not a local path: it has to come from the Hugging Face hub."""
    local = model.startswith((".", "/", "~")) or Path(model).expanduser().exists()
    return model.count("/") == 1 and not local


def download(repo_id: str, progress: LoadProgress) -> Path:
    """Fetch (or find in the cache) a hub model, reporting files done / files total."""
    from huggingface_hub import snapshot_download
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS
    from tqdm.auto import tqdm

    class Reporter(tqdm):
        """tqdm that mirrors its counter into `progress` (snapshot_download counts files)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # no terminal output under the TUI
            super().__init__(*args, **kwargs)
            self.files_done = 0.0  # a disabled tqdm does not count, so count here
            progress.update(f"downloading {repo_id}", 0, self.total)

        def update(self, n: float | None = 1) -> bool | None:
            self.files_done += n or 0
            progress.update(f"downloading {repo_id}", self.files_done, self.total)
            return super().update(n)

    path = snapshot_download(repo_id, allow_patterns=DEFAULT_ALLOW_PATTERNS, tqdm_class=Reporter)
    return Path(path)


def load_failure(model: str, error: BaseException | None) -> str:
    """Why loading ``model`` failed, on one line (a hub error goes on with its raw HTTP text).
    A hub model that could not be fetched says so: the network's own error (httpx's
    `ConnectError`, a DNS failure) named neither the hub nor what to do."""
    lines = str(error).strip().splitlines()
    reason = lines[0] if lines else type(error).__name__
    names = {cls.__name__ for cls in type(error).__mro__}
    if is_hub_id(model) and names & {"OSError", "TransportError", "TimeoutException"}:
        return (
            f"could not download it from the Hugging Face hub ({type(error).__name__}: "
            f"{reason}); check the network, or pick a model on this machine (F4; "
            "`macbatch models` lists them)"
        )
    return reason


def make_loader(model: str, config: EngineConfig, progress: LoadProgress) -> Callable[[], Engine]:
    """The function EngineThread runs on its own thread to build the engine for `model`."""

    def load() -> Engine:
        from macbatch.engine import Engine

        source = str(download(model, progress)) if is_hub_id(model) else model
        progress.update(f"loading {model}")
        return Engine.load(source, config)

    return load
