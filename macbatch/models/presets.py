"""Presets: a model with a system prompt and sampling settings under a name of the user's, kept
in ``presets.yaml`` in the config directory (``config.config_dir``), so that ``-m coder`` in
chat, ask, serve and a job file's ``model: coder`` means that model with those settings
(docs/models.md, "Presets"). The settings are a chat session's (``SessionSettings``): a preset
is checked the way a session is, when it is read."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the settings import the engine's sampling (MLX): not on `macbatch --help`
    from macbatch.session_settings import SessionSettings

PRESETS_FILE = "presets.yaml"


def setting_keys() -> dict[str, str]:
    """A preset's keys beside ``model``, each the ``SessionSettings`` field it sets."""
    from macbatch.session_settings import SAMPLING_FIELDS

    return {
        "system": "system_prompt",
        "thinking": "thinking",
        **{f.name: f.name for f in SAMPLING_FIELDS},
    }


class PresetError(ValueError):
    """presets.yaml cannot be read, or a preset in it is wrong (the file and preset named)."""


@dataclass(frozen=True)
class Preset:
    name: str
    model: str  # a model as -m takes it (not another preset)
    values: Mapping[str, Any]  # SessionSettings field -> the preset's value

    def settings(self, base: SessionSettings) -> SessionSettings:
        """``base`` (a command's defaults) with what the preset sets."""
        return dataclasses.replace(base, **self.values)

    def sampling(self) -> dict[str, Any]:
        """The sampling settings it sets, by their engine names (a job's ``sampling:``)."""
        return {k: v for k, v in self.values.items() if k not in ("system_prompt", "thinking")}

    @property
    def system(self) -> str | None:
        return self.values.get("system_prompt")


def layered(
    base: SessionSettings, preset: Preset | None, given: Mapping[str, Any]
) -> SessionSettings:
    """``base`` under the preset's settings under the options given (a value None: not given):
    what chat and ask start a conversation with. ``ValueError`` names a value the engine
    refuses."""
    if preset is not None:
        base = preset.settings(base)
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


def presets_path() -> Path:
    from macbatch.config import config_dir

    return config_dir() / PRESETS_FILE


def read_presets(path: Path | None = None) -> dict[str, Preset]:
    """Every preset of ``path`` (default: ``presets_path()``); none when there is no file."""
    import yaml

    path = presets_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise PresetError(f"cannot read {path}: {error}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PresetError(f"{path} is not YAML: {error}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PresetError(f"{path}: give one mapping of preset name -> its settings")
    return {str(name): _preset(path, str(name), given) for name, given in raw.items()}


def _preset(path: Path, name: str, given: Any) -> Preset:
    where = f"{path}: preset {name!r}"
    if "/" in name or ":" in name or not name.strip():
        raise PresetError(f"{where}: a preset's name has no '/' nor ':' (those are models')")
    if not isinstance(given, dict) or not isinstance(given.get("model"), str):
        raise PresetError(f"{where}: give at least `model: NAME`")
    keys = setting_keys()
    unknown = set(given) - {"model", *keys}
    if unknown:
        known = ", ".join(["model", *keys])
        raise PresetError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {known})")
    values = {keys[k]: v for k, v in given.items() if k != "model"}
    from macbatch.session_settings import SessionSettings

    try:
        SessionSettings(**values)
    except (TypeError, ValueError) as error:
        raise PresetError(f"{where}: {error}") from None
    return Preset(name, given["model"], values)
