"""The text models only mlx-vlm has (the families whose ``library`` is mlx-vlm's): mlx-vlm's own
loader reads the checkpoint (its config classes, and its ``sanitize`` for the weight names the
family's real checkpoints give), and the adapter serves the loaded model's ``language_model`` as
it serves an mlx-lm model, its attention rerouted in mlx-vlm's modules (``hooks/attention.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from macbatch import VISION_EXTRA

if TYPE_CHECKING:
    import mlx.nn as nn


def load_vlm_checkpoint(
    path: Path, model_type: str, lazy: bool
) -> tuple[nn.Module, dict[str, Any]]:
    """mlx-vlm's model of the checkpoint at ``path`` and its config, or why it cannot load."""
    from macbatch.engine.model.adapter import UnsupportedModelError

    try:
        from mlx_vlm.utils import load_config, load_model
    except ImportError as exc:
        raise UnsupportedModelError(
            f"model type '{model_type}' runs mlx-vlm's language model, and mlx-vlm is not "
            f"installed: {VISION_EXTRA}"
        ) from exc
    return load_model(path, lazy=lazy), load_config(path)
