"""A checkpoint's ``config.json``, read once the same way by everyone who asks about a model
(listing, vision, loading, ``doctor``): a folder a user dropped into ``--models-dir`` may hold
one that is not JSON, or not an object, and that must be one model's problem, said plainly,
never an exception that breaks a listing of every model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class BadConfig(ValueError):
    """A model folder's config.json is missing, unreadable or not a JSON object."""


def read_model_config(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model folder (``BadConfig``: what is wrong with it)."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BadConfig(f"{path} cannot be read as JSON ({error}); fix or remove it") from None
    if not isinstance(config, dict):
        raise BadConfig(f"{path} is not a JSON object; fix or remove it")
    return config
