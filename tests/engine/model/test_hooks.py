"""The runtime patches of mlx-lm: every one listed in ``hooks.HOOKS``, and installing them again
(another adapter over the same model) patches nothing twice."""

from __future__ import annotations

from pathlib import Path

from macbatch.engine.model import hooks
from macbatch.engine.model.adapter import ModelAdapter
from tests.support.tiny import build_model


def test_every_module_of_hooks_is_listed_once() -> None:
    modules = {path.stem for path in Path(hooks.__file__).parent.glob("*.py")} - {"__init__"}
    names = [hook.name for hook in hooks.HOOKS]
    assert sorted(names) == sorted(modules)


def test_installing_twice_patches_once() -> None:
    from mlx_lm.models import qwen3_next

    model = build_model("qwen3_5")  # a hybrid: every hook applies
    ModelAdapter(model)
    layers = ModelAdapter(model).model.layers
    attention = qwen3_next.scaled_dot_product_attention
    update = qwen3_next.gated_delta_update
    classes = [type(layer) for layer in layers]
    modules = [type(m) for layer in layers for _, m in layer.named_modules()]
    hooks.install(layers, layers)
    assert qwen3_next.scaled_dot_product_attention is attention
    assert qwen3_next.gated_delta_update is update
    assert [type(layer) for layer in layers] == classes
    assert [type(m) for layer in layers for _, m in layer.named_modules()] == modules
    assert attention.__module__ == "macbatch.engine.model.hooks.attention"
