"""DFlash drafters for the tiny targets: random ones, ones built to agree with the target, and
checkpoints in the Hugging Face layout of z-lab's ``*-DFlash-b16``, of DFlash2 and of DSpark
(config fields and weight names as mlx-vlm 0.7.10's ``qwen3_dflash``, ``dflash2`` and ``dspark``
loaders read them), written here by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from macbatch.engine.model.adapter import text_model
from macbatch.engine.speculative.dflash_model import DFlashConfig, DFlashModel
from tests.support.mtp import scale_outputs
from tests.support.oracle import layer_outputs

BLOCK_SIZE = 8


# what a DFlash2 checkpoint's ``dflash_config`` adds: its convolutions, its candidate selector,
# its scales (no runtime_block_size: mlx-vlm's default width for it, 5, applies)
DFLASH2_FIELDS = dict(
    conv_kernel_size=3,
    conv_group_size=16,
    selector_rank=8,
    selector_top_k=6,
    input_embedding_scale=1.5,
    output_multiplier=0.5,
    final_logit_softcapping=30.0,
)
# what a DSpark checkpoint's adds (its block_size there counts the drafts, not the known token;
# no runtime_block_size: mlx-vlm's default width for it, 8, applies)
DSPARK_FIELDS = dict(projector_type="dspark", markov_rank=8, enable_confidence_head=True)


def dflash_config(
    target: nn.Module,
    layers: int = 2,
    block_size: int = BLOCK_SIZE,
    variant: str = "dflash",
    causal: bool = False,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> dict:
    """A DFlash checkpoint's ``config.json`` for ``target`` (as z-lab's: Qwen3 fields, with the
    mask token and the target's layers under ``dflash_config``; a DFlash2 one's architecture
    and its block size and added fields there too). Causal blocks are ``dflash_config.causal``;
    sliding layers are Qwen3's ``layer_types`` and ``sliding_window``, a DSpark checkpoint's
    window its ``dflash_config.swa_window_size``."""
    args = text_model(target).args
    num_target = int(args.num_hidden_layers)
    extra = {
        "dflash": {},
        "dflash2": dict(DFLASH2_FIELDS, block_size=block_size),
        "dspark": dict(DSPARK_FIELDS, block_size=block_size - 1),
    }[variant]
    name = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}.get(variant)
    if causal:
        extra["causal"] = True
    windows: dict[str, Any] = {}
    if layer_types:
        windows["layer_types"] = layer_types
        if variant == "dspark":
            extra["swa_window_size"] = sliding_window
        else:
            windows["sliding_window"] = sliding_window
    return {
        "architectures": [name or "Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": int(args.hidden_size),
        "intermediate_size": 2 * int(args.hidden_size),
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": int(args.hidden_size) // 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_is_neox_style": variant != "dspark",  # GPT-J's pairs (MLX's traditional) there
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "vocab_size": int(args.vocab_size),
        "block_size": block_size,
        "num_target_layers": num_target,
        **windows,
        "dflash_config": {
            "mask_token_id": int(args.vocab_size) - 1,
            "target_layer_ids": sorted({0, num_target // 2, num_target - 1}),
            **extra,
        },
    }


def random_dflash(
    target: nn.Module, seed: int = 3, gain: float = 1.0, **config: Any
) -> DFlashModel:
    """A DFlash drafter for ``target`` with random weights: its drafts mostly fail. ``gain``
    scales its layers' output projections: at 1 the mask token's embedding outweighs what they
    add (every draft is the mask token); larger, its drafts depend on the context and the
    block."""
    mx.random.seed(seed)
    model = DFlashModel(DFlashConfig.from_dict(dflash_config(target, **config)))
    for layer in model.layers:
        layer.self_attn.o_proj.weight = gain * layer.self_attn.o_proj.weight
        layer.mlp.down_proj.weight = gain * layer.mlp.down_proj.weight
        for conv in ("attention_conv", "mlp_conv"):  # DFlash2's (zero base kernels as built)
            if conv in layer:
                layer[conv].base_kernel = mx.random.normal(layer[conv].base_kernel.shape)
    if "markov_head" in model:  # DSpark's: loud enough to change drafts
        model.markov_head.markov_w2.weight = 4 * model.markov_head.markov_w2.weight
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def agreeing_dflash(target: nn.Module, scale: float = 0.05, **config: Any) -> DFlashModel:
    """Scales ``target``'s layers' output projections down (in place: its next token is then
    nearly a function of the current one, as tests/support/mtp.py's predicting MTP layer
    makes it) and returns a drafter whose every block row computes that function of the block's
    known token: the context feature is zero (``fc`` zero), queries are zero (attention
    uniform), the values drop the mask token's direction (so only the known token's row adds
    one), a large output projection outweighs the residual, the MLP adds nothing and the last
    norm is the target's. So its first draft mostly holds, and all of them where the target
    repeats its token."""
    text = scale_outputs(target, scale)
    model = random_dflash(target, **config)
    embed = text.model.embed_tokens.weight
    mask = embed[model.config.mask_token_id]
    unit = mask / mx.linalg.norm(mask)
    dim = embed.shape[1]
    drop_mask = mx.eye(dim) - unit[:, None] * unit[None, :]
    model.fc.weight = mx.zeros_like(model.fc.weight)
    heads = model.config.num_attention_heads
    kv_heads, head_dim = model.config.num_key_value_heads, model.config.head_dim
    assert kv_heads * head_dim == dim and heads * head_dim == 2 * dim
    for layer in model.layers:
        attention = layer.self_attn
        attention.q_proj.weight = mx.zeros_like(attention.q_proj.weight)
        attention.k_proj.weight = mx.zeros_like(attention.k_proj.weight)
        attention.v_proj.weight = drop_mask
        # each KV head's values go out through the query heads that read it (two each)
        spread = mx.repeat(mx.eye(dim).reshape(kv_heads, head_dim, dim), 2, axis=0)
        attention.o_proj.weight = 1e4 * spread.reshape(heads * head_dim, dim).T / 2
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
        for conv in ("attention_conv", "mlp_conv"):  # DFlash2's: each row itself only
            if conv in layer:
                kernel = mx.zeros_like(layer[conv].base_kernel)
                kernel[:, 0] = 1.0
                layer[conv].base_kernel = kernel
                projection = layer[conv].kernel_projection
                projection.weight = mx.zeros_like(projection.weight)
    if "candidate_selector" in model:  # DFlash2's: no score beyond the logits
        projection = model.candidate_selector.hidden_projection
        projection.weight = mx.zeros_like(projection.weight)
    if "markov_head" in model:  # DSpark's: no correction
        w2 = model.markov_head.markov_w2
        w2.weight = mx.zeros_like(w2.weight)
    model.norm.weight = text.model.norm.weight
    mx.eval(model.parameters())
    return model


def save_dflash_checkpoint(
    path: Path, model: DFlashModel, target: nn.Module, draft_window: int | None = None
) -> Path:
    """``model`` as a Hugging Face DFlash checkpoint at ``path``: z-lab's names (no prefix,
    ``fc``, ``hidden_norm``, ``layers.*``, ``norm``; DFlash2's convolutions and selector, its
    codebooks stored bare; DSpark's Markov head and a random confidence head, which it stores
    and never drafts with) and config (``draft_window``: its ``dflash_config``'s
    ``draft_window_size``, which macbatch does not read)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    config = dflash_config(
        target,
        layers=cfg.num_hidden_layers,
        block_size=cfg.block_size,
        variant=cfg.variant,
        causal=cfg.causal,
        layer_types=cfg.layer_types or None,
        sliding_window=cfg.sliding_window,
    )
    if draft_window is not None:
        config["dflash_config"]["draft_window_size"] = draft_window
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = {
        k.removesuffix(".weight") if "codebook" in k else k: v
        for k, v in tree_flatten(model.parameters())
    }
    if cfg.variant == "dspark":
        inputs = cfg.hidden_size + cfg.markov_rank
        weights["confidence_head.proj.weight"] = mx.random.normal((1, inputs))
        weights["confidence_head.proj.bias"] = mx.random.normal((1,))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def mlx_vlm_drafts(path: Path, target: nn.Module, tokens: list[int], k: int) -> list[int]:
    """mlx-vlm 0.7.10's own DFlash (DFlash2, DSpark) drafter, loaded from the checkpoint at ``path``
    by the class its loader picks, drafting ``k`` tokens after ``tokens`` greedily: its context
    the outputs of ``target``'s layers (run here layer by layer over mlx-lm's causal mask) at
    positions ``0..len-2``, its cache its own (its sliding layers' rotating caches, or the
    buffered one of a ``draft_window_size``: all fed the whole context at once)."""
    from mlx_vlm.speculative.drafters.qwen3_dflash.dflash import DFlashDraftModel
    from mlx_vlm.utils import get_model_and_args

    raw = json.loads((path / "config.json").read_text())
    module, _ = get_model_and_args(raw)
    drafter = module.Model(module.ModelConfig.from_dict(raw))
    weights = drafter.sanitize(dict(mx.load(str(path / "model.safetensors"))))  # type: ignore[arg-type]
    drafter.load_weights(list(weights.items()))
    # bound as DFlash's own bind does: DFlash2's and DSpark's first check the target for
    # mlx-vlm's cache rollback, which mlx-lm's models (the round loop's, not the drafter's) lack
    DFlashDraftModel.bind(drafter, target)
    cache = drafter.make_cache()
    outputs = layer_outputs(target, tokens[:-1])
    ids = raw["dflash_config"]["target_layer_ids"]
    hidden = mx.concatenate([outputs[i] for i in ids], axis=-1)
    drafts = drafter.draft_block(
        tokens[-1], hidden, cache, k + 1, lambda logits: mx.argmax(logits, axis=-1)
    )
    return [int(t) for t in drafts.reshape(-1).tolist()]
