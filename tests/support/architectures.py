"""A tiny random config for every model module of mlx-lm's ``mlx_lm/models/``: what the
every-architecture test builds (tests/engine/model/test_every_architecture.py).

Each module's config is derived, not written out: ``_COMMON`` (the fields most modules share,
tiny), then a value for every field its ``ModelArgs`` requires that ``_COMMON`` lacks (by name
from ``_BY_NAME``, else by its annotated type), then the module's row of ``OVERRIDES`` for what a
rule cannot guess. A module is a model when it defines ``Model`` and ``ModelArgs``; the rest
(``base``, ``cache``, ``rope_utils`` ...) are its helpers.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from types import ModuleType
from typing import Any

import mlx_lm.models

from tests.support.tiny import VOCAB_SIZE

_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    layer_norm_eps=1e-5,
    norm_eps=1e-5,
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    # MoE modules: four small experts
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    num_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    # MLA modules: one latent row of 64 + 16
    kv_lora_rank=64,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
)
# what a required field of another name means, in the names other modules give it
_BY_NAME: dict[str, Any] = dict(
    n_embd=64, d_model=64, hidden_dim=64, dim=64, model_dim=64,
    n_layer=2, n_layers=2, num_layers=2,
    n_head=4, n_heads=4, num_heads=4,
    n_kv_heads=2, num_kv_heads=2,
    n_inner=128, ffn_hidden_size=128, ffn_dim=128,
    n_ctx=4096, n_positions=4096, block_size=4096, model_max_length=4096,
    layer_norm_epsilon=1e-5, norm_epsilon=1e-5,
    rotary_emb_base=10000.0, rotary_pct=1.0, partial_rotary_factor=1.0, rotary_dim=16,
    shared_intermediate_size=128, moe_shared_expert_intermediate_size=32,
    sliding_window=8, hidden_act="silu",
)  # fmt: skip
_BY_TYPE: dict[str, Any] = {"bool": False, "int": 2, "float": 1.0}

# what a rule cannot guess, per module
OVERRIDES: dict[str, dict[str, Any]] = {}


def model_modules() -> list[str]:
    """Every module of ``mlx_lm/models/`` that defines a model (``Model`` and ``ModelArgs``)."""
    return [name for name in _module_names() if _is_model(name)]


def helper_modules() -> list[str]:
    """The modules of ``mlx_lm/models/`` that are a model's helpers, not a model."""
    return [name for name in _module_names() if not _is_model(name)]


def _module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__))


def _is_model(name: str) -> bool:
    module = _module(name)
    return module is not None and hasattr(module, "Model") and hasattr(module, "ModelArgs")


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"mlx_lm.models.{name}")
    except (ImportError, SystemExit):  # olmo asks for a package and exits when it is missing
        return None


def tiny_config(name: str) -> dict[str, Any]:
    """The tiny config of model module ``name`` (a config.json's fields)."""
    module = _module(name)
    assert module is not None
    config: dict[str, Any] = dict(_COMMON, model_type=name)
    for field in dataclasses.fields(module.ModelArgs):
        required = field.default is dataclasses.MISSING and (
            field.default_factory is dataclasses.MISSING
        )
        if required and field.name not in config:
            config[field.name] = _guess(field)
    config.update(OVERRIDES.get(name, {}))
    return config


def _guess(field: dataclasses.Field[Any]) -> Any:
    if field.name in _BY_NAME:
        return _BY_NAME[field.name]
    kind = str(field.type).split("|")[0].strip()
    return _BY_TYPE.get(kind)
