"""A tiny random model of a family only mlx-vlm has, from its checkpoint's config (text config
fields replaceable), and its checkpoint: what the ``tiny_<family>`` modules share."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from tests.support.tiny import randomize, save_checkpoint

# the rescaling and normalizing fields the tiny VLMs' image processors share (pixels to [-1, 1])
HALF_NORMALIZED: dict[str, Any] = {
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
}


@dataclass(frozen=True)
class TinyVlmFamily:
    """mlx-vlm's ``models.<package>`` built from ``config``; ``randomized``: the suffixes of the
    parameters its classes create as zeros or ones, drawn at random so a test sees them act."""

    package: str
    config: dict[str, Any]
    randomized: tuple[str, ...]

    def config_with(self, **text: Any) -> dict[str, Any]:
        """The config with ``text``'s text config fields replaced."""
        config = copy.deepcopy(self.config)
        config["text_config"].update(text)
        return config

    def model(self, seed: int = 0, **text: Any) -> Any:
        """mlx-vlm's own model of the config (float32, random weights)."""
        module = importlib.import_module(f"mlx_vlm.models.{self.package}")
        mx.random.seed(seed)
        model = module.Model(module.ModelConfig.from_dict(self.config_with(**text)))
        model.set_dtype(mx.float32)
        randomize(model, self.randomized, 0.3)
        return model

    def save(self, path: Path, seed: int = 0, **text: Any) -> Path:
        """The tiny checkpoint in ``path``."""
        return save_checkpoint(path, self.model(seed, **text), self.config_with(**text))
