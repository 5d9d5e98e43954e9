"""What a model name on the command line means, decided here once for every command that takes
one (``-m/--model``, ``pull``, ``rm``, a job file's ``model:``): a local path, a Hugging Face id
(owner/name) or a bundled model as written; else a preset of the user's (``presets.py``); else a
short name of the shipped catalogue (``shortnames.csv``: ``qwen3:0.6b``, ``gemma3``), which
becomes its mlx-community repo; else an error with the names closest to it (docs/models.md,
"Short names")."""

from __future__ import annotations

import csv
import difflib
import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from macbatch.models.presets import Preset, read_presets

BUNDLED_MODELS = ("demo", "demo-vision")  # the names the engine's loader resolves itself
CATALOGUE_FILE = "shortnames.csv"
# an affine-quantized weight also stores a 16-bit scale and bias per group of 64: half a bit
SCALE_BITS = 0.5


@dataclass(frozen=True)
class Known:
    """One catalogue entry: a short name (and its aliases) for an mlx-community repo."""

    name: str
    aliases: tuple[str, ...]
    family: str
    params_b: float  # billions of parameters, as published
    bits: int
    repo: str

    @property
    def quantization(self) -> str:
        return f"{self.bits}-bit"

    @property
    def weights_bytes(self) -> int:
        """The weights' memory, from the parameter count and the bits (not read from the hub)."""
        return int(round(self.params_b * 1e9) * (self.bits + SCALE_BITS) / 8)


class UnknownModel(ValueError):
    """A name that is no path, hub id, bundled model, preset nor short name."""


@dataclass(frozen=True)
class Resolved:
    model: str  # what the engine loads: a path, a hub id or a bundled model
    preset: Preset | None = None
    known: Known | None = field(default=None, compare=False)


@functools.cache
def catalogue() -> tuple[Known, ...]:
    """The shipped short names, in the file's order."""
    text = resources.files("macbatch.models").joinpath(CATALOGUE_FILE).read_text("utf-8")
    rows = csv.reader(line for line in text.splitlines() if line and not line.startswith("#"))
    return tuple(
        Known(name, tuple(aliases.split()), family, float(params), int(bits), repo)
        for name, aliases, family, params, bits, repo in rows
    )


def short_name(name: str) -> Known | None:
    """The catalogue entry ``name`` (any case) or one of its aliases names."""
    wanted = name.lower()
    return next((k for k in catalogue() if wanted == k.name or wanted in k.aliases), None)


def by_repo(repo: str) -> Known | None:
    return next((k for k in catalogue() if k.repo == repo), None)


def is_literal(name: str) -> bool:
    """A name taken as written: bundled, a path (or one that looks like a path) or a hub id."""
    return (
        name in BUNDLED_MODELS
        or "/" in name
        or name.startswith((".", "~"))
        or Path(name).expanduser().exists()
    )


def resolve(name: str, presets: dict[str, Preset] | None = None) -> Resolved:
    """What ``name`` means (``presets``: the user's, read from the config directory when None);
    ``UnknownModel`` (with did-you-mean) or ``PresetError`` when it means nothing."""
    if is_literal(name):
        return Resolved(name, known=by_repo(name))
    presets = read_presets() if presets is None else presets
    if name in presets:
        preset = presets[name]
        model = preset.model if is_literal(preset.model) else _short(preset.model, presets)
        return Resolved(model, preset, by_repo(model))
    return Resolved(_short(name, presets), known=short_name(name))


def _short(name: str, presets: dict[str, Preset]) -> str:
    if (found := short_name(name)) is not None:
        return found.repo
    names = [*BUNDLED_MODELS, *presets, *(n for k in catalogue() for n in (k.name, *k.aliases))]
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownModel(
        f"model '{name}' is not a local directory, a Hugging Face id (owner/name), a bundled "
        f"model, a preset nor a short name (macbatch models --available){hint}"
    )


def expected_weights_bytes(model: str) -> int | None:
    """The weights' bytes of a resolved model before it loads: a directory's (or the hub
    cache's copy) files, else the catalogue's figure; None when nothing says."""
    from macbatch.models.memory import weights_bytes

    if model == "demo":
        from macbatch.demo import MODEL_DIR

        return weights_bytes(MODEL_DIR)
    if Path(model).expanduser().is_dir():
        return weights_bytes(Path(model).expanduser())
    if (cached := _hub_snapshot(model)) is not None:
        return weights_bytes(cached)
    known = by_repo(model)
    return None if known is None else known.weights_bytes


def _hub_snapshot(repo: str) -> Path | None:
    """The hub cache's copy of ``repo`` (no network), if it has one."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # not cached, not a valid id, no hub library: nothing to read
        return None
