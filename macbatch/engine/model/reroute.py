"""One way the hooks patch mlx-lm: a function its model modules import by name, replaced in each.

mlx-lm's model modules import shared functions by name (``from .base import
scaled_dot_product_attention``), so patching the defining module changes nothing: each importer
holds its own reference (mlx-vlm's language models do the same within their own ``models``
package, rerouted the same way for the families whose code is mlx-vlm's). ``reroute`` replaces
that reference in every loaded model module that still holds the original; a module patched
already, or one loaded after, is left as it is until the next call (``hooks.install`` runs once
per loaded model).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def reroute(
    home: ModuleType, name: str, replacement: Callable[[Any], Any], package: str | None = None
) -> list[str]:
    """Replace ``home.name`` (a function, or a module such as numpy) by
    ``replacement(original)`` in every loaded module of ``package`` (by default ``home``'s:
    ``mlx_lm.models``, or mlx-vlm's) that imported it; returns those modules' names."""
    original: Any = getattr(home, name)
    package = (package or home.__name__.rsplit(".", 1)[0]) + "."
    patched = []
    for module_name, module in list(sys.modules.items()):
        ours = module_name.startswith(package) and module is not home
        if ours and getattr(module, name, None) is original:
            vars(module)[name] = replacement(original)
            patched.append(module_name)
    return patched
