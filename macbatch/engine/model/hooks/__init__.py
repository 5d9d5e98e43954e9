"""Runtime patches of mlx-lm's code, listed and installed in one place, each with why it exists.

Each hook reroutes a name mlx-lm's model modules import, or swaps the class of a loaded model's
layers, so that the engine's packed step runs its own code where it must. Outside the engine's
step (mlx-lm's own generation in the same process: the tests' oracle, the benchmarks' peer) every
patched call runs mlx-lm's own. ``install`` is idempotent: a module or layer patched already is
left as it is, and model modules loaded since (another model's) are patched too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from macbatch.engine.model.hooks import (
    attention,
    block_sparse_attention,
    cpu_activations,
    depthwise_conv,
    direct_attention,
    flat_topk,
    gated_delta,
    latent_attention,
    long_rope,
    mrope_sections,
    offset_rope,
    pooled_sparse_attention,
    recurrent_layers,
    reused_kv,
    row_positions,
    scalar_offsets,
    shared_kv_window,
    softcap_attention,
    ssm_cut,
    token_history,
)


@dataclass(frozen=True)
class Target:
    """What the hooks patch in one loaded model."""

    layers: Sequence[Any]  # its decoder layers
    # the modules handed a recurrent state cache: a hybrid's decoder layers, or the mixer beside
    # each layer's attention (Falcon-H1's); empty for an attention-only model
    recurrent: Sequence[Any]
    # the attention modules that cap their scores inline (the family's record names them)
    softcapped: Sequence[Any] = ()
    inner: Any = None  # the inner transformer
    # the attention modules that read their cache's offset as a number, in an inner transformer
    # that does too (Llama 4; the family's record names them)
    scalar_offsets: Sequence[Any] = ()
    # the attention modules that rotate by a RoPE table cut at their cache's offset as one number
    # (HunYuan VL; the family's record names them)
    offset_ropes: Sequence[Any] = ()
    # the attention modules of the family's record (AFM 7's), those of them handed another
    # layer's K/V as arrays swapped
    reused_kv: Sequence[Any] = ()


@dataclass(frozen=True)
class Hook:
    name: str  # its module here
    why: str
    install: Callable[[Target], None]
    recurrent: bool = False  # only a model with recurrent layers needs it


HOOKS: tuple[Hook, ...] = (
    Hook(
        "attention",
        "every layer's attention reaches the engine's paged K/V through the name each model "
        "module imports, scaled_dot_product_attention",
        lambda _: attention.install(),
    ),
    Hook(
        "direct_attention",
        "some layers (mlx-vlm's Phi-3-Vision, Moondream 2, Phi-4) call "
        "mx.fast.scaled_dot_product_attention themselves, with no cache; their module's mx is "
        "given a view whose attention knows the K/V the engine's cache just fetched",
        lambda target: direct_attention.install(target.layers),
    ),
    Hook(
        "latent_attention",
        "MLA layers (DeepSeek, Kimi K2, GLM-4.7-Flash, MiniCPM3, Mistral Small 4) hand mlx-lm's "
        "cache their latent and attend through a score mask or per-head keys; the packed step "
        "writes one latent row per token and attends over the latent pages, absorbed",
        lambda target: latent_attention.install(target.layers),
    ),
    Hook(
        "block_sparse_attention",
        "Qwen4-exp's attention has its indexer append its keys to mlx-vlm's own cache and attends "
        "through its QSA kernel or a mask; the packed step pages the keys, selects each row's "
        "positions and attends over the pages reading those alone",
        lambda target: block_sparse_attention.install(target.layers),
    ),
    Hook(
        "pooled_sparse_attention",
        "GLM5-next's attention keeps its latent and its pooling indexer's keys in mlx-vlm's own "
        "caches (a PoolingCache among them); the packed step pages both, selects each row's "
        "positions and attends over the latent pages reading those alone",
        lambda target: pooled_sparse_attention.install(target.layers),
    ),
    Hook(
        "flat_topk",
        "mlx-vlm's DeepSeek V4 indexer selects by HISA (the top-k inside the best blocks of rows) "
        "past 1,024 compressed rows, where DeepSeek's reference takes the top-k of every row",
        lambda target: flat_topk.install(target.layers),
    ),
    Hook(
        "shared_kv_window",
        "DeepSeek V4's uncompressed attention (its MTP layer's) writes one key, its value too, "
        "with an empty value and attends with its window's array mask; the packed step pages it "
        "as one K/V head and attends over the pages with the window and sinks",
        lambda target: shared_kv_window.install(target.layers),
    ),
    Hook(
        "row_positions",
        "GPT-BigCode counts its position ids with numpy from the cache's offset, a number to "
        "mlx-lm but every row's own position in the packed step",
        lambda _: row_positions.install(),
    ),
    Hook(
        "softcap_attention",
        "Gemma 2's attention caps its scores inline instead of calling "
        "scaled_dot_product_attention; the packed step attends with the kernel's softcap",
        lambda target: softcap_attention.install(target.softcapped),
    ),
    Hook(
        "scalar_offsets",
        "Llama 4 builds its chunk masks and its query temperatures with mx.arange from the "
        "cache's offset, a number to mlx-lm but every row's own position in the packed step",
        lambda target: scalar_offsets.install(target.inner, target.scalar_offsets),
    ),
    Hook(
        "offset_rope",
        "HunYuan VL's attention rotates by a RoPE table cut at its cache's offset as one number "
        "(the largest of a batch's), where each row of the packed step has its own position",
        lambda target: offset_rope.install(target.offset_ropes),
    ),
    Hook(
        "reused_kv",
        "AFM 7's KV-reuse layers are handed the last cached layer's K/V as arrays, no cache, and "
        "rotate at the number of keys less the queries; the packed step rotates each row at its "
        "own position and attends over that layer's pages",
        lambda target: reused_kv.install(target.reused_kv),
    ),
    Hook(
        "mrope_sections",
        "mlx-vlm's sectioned M-RoPE (GLM-4V's) lays out its cos and sin with mx.split, which "
        "mx.compile of the packed decode step raises on; the same slices cut one by one",
        lambda _: mrope_sections.install(),
    ),
    Hook(
        "long_rope",
        "mlx-lm's LongRoPE (Phi-3.5, Phi-4-mini) always rotates by the long factors and "
        "mlx-vlm's (Phi-4-multimodal) by the furthest position of the step; transformers uses "
        "the short ones within the original positions, so each row chooses by its own position "
        "and its request's prompt length",
        lambda target: long_rope.install(target.layers, target.inner),
    ),
    Hook(
        "recurrent_layers",
        "a recurrent layer must see each request's tokens in order, so it runs the step's "
        "sequences apart, each from its state slot",
        lambda target: recurrent_layers.install(target.recurrent),
        recurrent=True,
    ),
    Hook(
        "depthwise_conv",
        "MLX's CPU convolution takes a depthwise conv one channel at a time; shifted sums take "
        "about a quarter of its time in the recurrent prefill",
        lambda target: depthwise_conv.install(target.layers),
        recurrent=True,
    ),
    Hook(
        "gated_delta",
        "off a Mac's GPU mlx-lm steps a Gated DeltaNet through a prompt token by token; a "
        "chunked prefill, and a decode step that reads the state once",
        lambda _: gated_delta.install(),
        recurrent=True,
    ),
    Hook(
        "ssm_cut",
        "a Mamba 2 layer's verification leaves its state after the first token inside one "
        "call of the layer (its weights read once), the scan run in two parts",
        lambda _: ssm_cut.install(),
        recurrent=True,
    ),
    Hook(
        "token_history",
        "Qwen4-exp's n-gram embedding keeps its context's token ids as layer state and reads a "
        "fresh one as EOS; the engine's fresh state slots are zeros, so they keep each id plus one",
        lambda target: token_history.install(target.layers),
        recurrent=True,
    ),
    Hook(
        "cpu_activations",
        "MLX's CPU exp is scalar on x86; the recurrent layers' SiLUs from a vectorized "
        "logistic function",
        lambda _: cpu_activations.install(),
        recurrent=True,
    ),
)


def install(
    layers: Sequence[Any],
    recurrent: Sequence[Any] = (),
    softcapped: Sequence[Any] = (),
    inner: Any = None,
    scalar_offsets: Sequence[Any] = (),
    offset_ropes: Sequence[Any] = (),
    reused_kv: Sequence[Any] = (),
) -> None:
    """Install every hook a loaded model needs: ``layers``, its decoder layers; ``recurrent``,
    the modules handed a recurrent state cache (``Target``; empty: attention only);
    ``softcapped``, the attention modules that cap their scores inline; ``inner`` and
    ``scalar_offsets``, the inner transformer and the attention modules that read a cache's
    offset as a number; ``offset_ropes``, the attention modules that rotate by a RoPE table cut
    at their cache's offset; ``reused_kv``, the attention modules (of the family's record) among
    which those handed another layer's K/V as arrays are swapped."""
    target = Target(layers, recurrent, softcapped, inner, scalar_offsets, offset_ropes, reused_kv)
    for hook in HOOKS:
        if target.recurrent or not hook.recurrent:
            hook.install(target)
