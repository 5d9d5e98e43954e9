"""The embedded demo model: where it lives, the tasks it was trained on, and how answers are scored.

`MODEL_DIR` is the shipped model (Hugging Face layout, loadable by `mlx_lm.load`); `Engine.load`
resolves the name "demo" to it so macbatch works offline out of the box.
"""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo"

__all__ = ["MODEL_DIR"]
