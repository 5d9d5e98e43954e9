"""A checkpoint's ``config.json``, read once the same way by everyone who asks about a model
(listing, vision, loading, ``doctor``): a folder a user dropped into ``--models-dir`` may hold
one that is not JSON, or not an object, and that must be one model's problem, said plainly,
never an exception that breaks a listing of every model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# larger than any real model's config.json by far (DeepSeek's and Kimi's are under 10 KiB): a
# bigger one is refused unread, so a hostile folder cannot stall a listing or a load parsing it
MAX_CONFIG_BYTES = 8 * 2**20


class BadConfig(ValueError):
    """A model folder's config.json is missing, unreadable or not a JSON object."""


def read_model_config(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model folder (``BadConfig``: what is wrong with it)."""
    path = Path(directory) / "config.json"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise BadConfig(
                f"{path} is {size:,} bytes, more than any model's config.json "
                f"({MAX_CONFIG_BYTES:,} at most): refused unread"
            )
        config = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        if isinstance(error, BadConfig):
            raise
        reason = str(error)[:100]
        raise BadConfig(f"{path} cannot be read as JSON ({reason}); fix or remove it") from None
    if not isinstance(config, dict):
        raise BadConfig(f"{path} is not a JSON object; fix or remove it")
    return config
