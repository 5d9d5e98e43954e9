"""Absorbed multi-head latent attention (MLA) in the packed step: a class swap of the MLA
attention modules of DeepSeek V2/V3, Kimi K2, GLM-4.7-Flash, MiniCPM3, Mistral Small 4.

mlx-lm's MLA layers hand their cache the compressed latent and the shared RoPE key and attend
with a score mask built from the keys the cache returns, or expand a key and a value per head;
neither reaches the paged pool. ``install`` swaps each such module's class for a subclass whose
``__call__``, when handed an engine cache (``EngineAttention``), runs the absorbed form: each
head's non-RoPE query is projected into the latent space through the key up-projection
(``embed_q``, or the key half of ``kv_b_proj``), the roped query part is appended, the token's
latent row (the normed latent, then the roped shared key) is written to the latent pages, one
attention over those rows (``EngineAttention.attend_latent``: values are their leading
``kv_lora_rank`` columns) gives each head a latent output, and the value up-projection
(``unembed_out``, or the value half of ``kv_b_proj``) maps it to the head's value. So decode and
prefill read only the latent. A layer with a lightning indexer (DeepSeek V3.2, GLM-5) first has
its cache select each row's top-k positions from the query latent (``EngineAttention.select``),
and the attention reads those rows alone. With any other cache (mlx-lm's own generation in the
same process) the module runs exactly as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention

# what marks a module as MLA attention: its latent projection and its size, and an output
# projection under one of these names
_MARKS = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_lora_rank", "qk_rope_head_dim")
_OUTPUT_NAMES = ("o_proj", "dense")
_GATE_NAMES = ("g_proj", "linear_gate")  # a sigmoid output gate (Hunyuan V4's: linear_gate)

_LATENT_CLASSES: dict[type, type] = {}
# the argument of Hunyuan V4's attention holding the selection of the last layer that indexed
# (its "shared" layers have no indexer), which it returns beside its output
_HANDS_ON = "prev_topk_indices"


def is_latent_attention(module: Any) -> bool:
    """Whether ``module`` is an MLA attention module this hook runs (its class swapped or not)."""
    return (
        isinstance(module, nn.Module)
        and all(hasattr(module, name) for name in _MARKS)
        and any(hasattr(module, name) for name in _OUTPUT_NAMES)
    )


def latent_modules(layer: nn.Module) -> list[Any]:
    """``layer``'s MLA attention modules among its children, a list of them included (LongCat
    Flash's two attentions per layer, ``self_attn[0]`` and ``self_attn[1]``)."""
    children = layer.children().values()
    found = [m for c in children for m in (c if isinstance(c, list | tuple) else [c])]
    return [m for m in found if is_latent_attention(m)]


def install(layers: Sequence[Any]) -> None:
    """Swap the class of every MLA attention module among ``layers``' children for one that runs
    the absorbed form when handed an engine cache (parameters and their names untouched)."""
    for layer in layers:
        for module in latent_modules(layer):
            swap_call(module, _LATENT_CLASSES, _latent_call)


def _latent_call(
    self: Any, *args: Any, **kwargs: Any
) -> mx.array | tuple[mx.array, mx.array | None]:
    cls = type(self)
    original = super(cls, self).__call__
    bound = _signature(cls.__bases__[0]).bind(self, *args, **kwargs).arguments
    cache = bound.get("cache")
    if not isinstance(cache, EngineAttention):
        return original(*args, **kwargs)
    x = list(bound.values())[1]  # after self
    out, selected = absorbed_attention(
        self, x, cache, bound.get("attn_scale"), bound.get(_HANDS_ON)
    )
    if _HANDS_ON in _signature(cls.__bases__[0]).parameters:
        return out, selected  # what mlx-vlm's Hunyuan V4 decoder loop hands the next layer
    return out


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    """mlx-lm's ``__call__`` signature of an MLA class (read once: the step calls it per layer)."""
    return inspect.signature(cls.__call__)


def absorbed_attention(
    attn: Any,
    x: mx.array,
    cache: EngineAttention,
    query_scale: mx.array | None,
    shared: mx.array | None = None,
) -> tuple[mx.array, mx.array | None]:
    """One MLA layer over packed rows ``x [N, 1, hidden]`` (one token each, at
    ``cache.offset``): the latent row written, attention over the latent pages, the output
    projected. ``query_scale``: Mistral Small 4's per-position query scaling (llama 4's);
    ``shared``: the selection a layer without an indexer reads (Hunyuan V4's). Returns the
    output and the positions the rows read (None: every visible one)."""
    n, length, _ = x.shape
    heads, nope = _heads(attn), attn.qk_nope_head_dim
    rank, rope_dim = attn.kv_lora_rank, attn.qk_rope_head_dim
    qr = None  # the normed query latent, when the layer has one
    if getattr(attn, "q_proj", None) is not None:
        q = attn.q_proj(x)
    else:
        qr = attn.q_a_layernorm(attn.q_a_proj(x))
        q = attn.q_b_proj(qr)
    q = q.reshape(n, length, heads, -1).transpose(0, 2, 1, 3)
    # LongCat Flash scales its query and its normed latent by the LoRA ranks' width ratios
    q_lora, kv_lora = (getattr(attn, f"mla_scale_{n}_lora", None) for n in ("q", "kv"))
    if q_lora is not None:
        q = q * q_lora
    q_nope, q_pe = mx.split(q, [nope], axis=-1)
    latent, k_pe = mx.split(attn.kv_a_proj_with_mqa(x), [rank], axis=-1)
    latent = attn.kv_a_layernorm(latent)
    if kv_lora is not None:
        latent = latent * kv_lora
    latent = mx.expand_dims(latent, axis=1)
    k_pe = k_pe.reshape(n, length, 1, rope_dim).transpose(0, 2, 1, 3)
    rope = getattr(attn, "rope", None)  # None: positions unrotated (Kimi Linear's NoPE layers)
    if rope is not None:
        q_pe, k_pe = rope(q_pe, cache.offset), rope(k_pe, cache.offset)
    if query_scale is not None:
        q_nope, q_pe = q_nope * query_scale, q_pe * query_scale
    up = _up_projections(attn)
    queries = mx.concatenate([up.absorb_query(q_nope), q_pe], axis=-1)
    row = mx.concatenate([latent, k_pe], axis=-1)
    indexer = getattr(attn, "indexer", None)  # DeepSeek Sparse Attention's lightning indexer
    selected = shared
    if indexer is not None:  # it reads the query latent (every DSA layer has one)
        assert qr is not None
        selected = cache.select(indexer, x, qr)
    sinks = getattr(attn, "learnable_sink_param", None)  # Hunyuan V4's per-head sink logits
    out = cache.attend_latent(queries, row, _softmax_scale(attn), rank, selected, sinks)
    return _output(attn, up.values(out).transpose(0, 2, 1, 3), x), selected


def _heads(attn: Any) -> int:
    """The layer's query heads (LongCat Flash names them ``num_attention_heads``)."""
    heads = getattr(attn, "num_heads", None)
    return int(heads if heads is not None else attn.num_attention_heads)


def _output(attn: Any, out: mx.array, x: mx.array) -> mx.array:
    """Each head's value ``[N, 1, H, v]`` through the layer's output gate, when it has one (a
    sigmoid of ``g_proj(x)``: one per head, Ling 2.5's, or one per value, Kimi K3's; Hunyuan
    V4's ``linear_gate``, one per value), and its output projection."""
    n, length, heads, _ = out.shape
    gates = (getattr(attn, name, None) for name in _GATE_NAMES)
    gate = next((g for g in gates if g is not None), None)
    if gate is not None:
        g = mx.sigmoid(gate(x).astype(mx.float32)).astype(out.dtype)
        out = out * (g[..., None] if g.shape[-1] == heads else g.reshape(out.shape))
    project = next(getattr(attn, name) for name in _OUTPUT_NAMES if hasattr(attn, name))
    return project(out.reshape(n, length, -1))


def _softmax_scale(attn: Any) -> float:
    """The layer's softmax scale, yarn's mscale folded in by mlx-lm already."""
    scale = getattr(attn, "scale", None)
    return float(scale if scale is not None else attn.softmax_scale)


@dataclass(frozen=True)
class _FromKvB:
    """The key and value up-projections split out of ``kv_b_proj`` (float, once per layer), for
    the families whose mlx-lm code expands per head (DeepSeek V2, MiniCPM3)."""

    keys: mx.array  # [H, nope, rank]
    values: mx.array  # [H, v, rank]


class _UpProjections:
    """A layer's key up-projection (absorbed into the query) and value up-projection."""

    def __init__(self, attn: Any) -> None:
        self.attn = attn
        self.kv_b: _FromKvB | None = None
        if getattr(attn, "embed_q", None) is None:
            self.kv_b = _split_kv_b(attn)

    def absorb_query(self, q_nope: mx.array) -> mx.array:
        """``[N, H, 1, nope]`` -> ``[N, H, 1, rank]``."""
        if self.kv_b is None:
            return self.attn.embed_q(q_nope)
        return q_nope @ self.kv_b.keys.astype(q_nope.dtype)

    def values(self, out: mx.array) -> mx.array:
        """``[N, H, 1, rank]`` -> ``[N, H, 1, v]``."""
        if self.kv_b is None:
            return self.attn.unembed_out(out)
        return out @ self.kv_b.values.astype(out.dtype).swapaxes(-1, -2)


def _up_projections(attn: Any) -> _UpProjections:
    """The layer's up-projections, built once (a plain attribute: not one of its parameters)."""
    up = attn.__dict__.get("_macbatch_up")
    if up is None:
        up = _UpProjections(attn)
        object.__setattr__(attn, "_macbatch_up", up)
    return up


def _split_kv_b(attn: Any) -> _FromKvB:
    proj = attn.kv_b_proj
    weight = proj.weight
    # quantized: nn.QuantizedLinear, or its tensor-parallel shard (QuantizedAllToShardedLinear,
    # not a subclass of it): both keep their scales beside the weight
    if "scales" in proj:
        weight = mx.dequantize(
            weight, proj.scales, proj.get("biases"), proj.group_size, proj.bits, mode=proj.mode
        )
    weight = weight.reshape(_heads(attn), -1, attn.kv_lora_rank)
    keys, values = mx.split(weight, [attn.qk_nope_head_dim], axis=1)
    return _FromKvB(keys, values)  # evaluated once, by the first step that reads them
