"""DeepSeek V4's lightning indexers select the flat top-k, as DeepSeek's reference does.

mlx-vlm 0.7.10's V4 indexer (``deepseek_v4/language.py``, ``Indexer``) switches to HISA once a
sequence holds ``index_block x index_keep`` compressed rows (1,024 by default: 4,096 tokens at
ratio 4): block means of ``index_block`` rows choose ``index_keep`` blocks and the top-k is taken
inside those alone, an approximation whose one-token path never even considers the rows after
the last whole block (the newest). DeepSeek's published inference code scores every visible row
and takes their top-k. ``index_block`` 0 is mlx-vlm's own switch to that flat path, so the hook
sets it on the loaded model's indexers (found by their HISA method, whichever family has them);
the engine's held caches then give the reference's selection at every length
(docs/engine.md, "DeepSeek V4 as released"). A model loaded apart, as the tests' oracle is,
keeps mlx-vlm's setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def install(layers: Sequence[Any]) -> None:
    """Every HISA indexer in ``layers`` takes the flat top-k from now on."""
    for layer in layers:
        for _, module in layer.named_modules():
            if hasattr(module, "_hisa_select") and hasattr(module, "index_block"):
                module.index_block = 0
