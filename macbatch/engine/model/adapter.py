"""Runs an unmodified mlx-lm model as one packed forward over the paged KV cache.

How (see shared notes): the model gets inputs shaped (N, 1), one token per batch row, and a cache
object per layer whose ``offset`` is the (N,) array of token positions, so ``mx.fast.rope`` gives
each token its own position. The cache object writes K/V into the pages; the attention hook
(``hooks/attention.py``, installed with the others by ``hooks.install``) hands it the layer's
queries, which it attends with ``macbatch.metal.paged_attention``, while every other cache still
gets mlx-lm's own function, so plain mlx-lm generation in the same process is unaffected.
Sliding windows reach it through ``make_mask``. Only the sampled rows go through the LM head,
applied by the model's own ``__call__`` so tied embeddings, logit scaling and softcaps stay the
architecture's. What a probe cannot see of a family (a refusal, a side-by-side mixer, image rows
entering after the input scaling) is read from its record in ``families.py``.

Multimodal checkpoints (gemma3, mistral3, gemma4) keep a complete text model at
``model.language_model``; the adapter serves that text model. Layers that reuse another layer's
K/V (Gemma 4's KV-shared layers) are found by the probe (``kv_probe.py``) and read the source
layer's pages, so the pool holds one set of pages per layer mlx-lm keeps a cache for; each step's
per-layer cache objects are ``paged_cache.PagedLayerCache`` (attention) and
``recurrent.PagedStateCache`` (recurrent state).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model import hooks
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.families import (
    family,
    library_type,
    remapped_types,
    unsupported_reason,
)
from macbatch.engine.model.flat_model import FlatTransformer, is_flat
from macbatch.engine.model.held_attention import HeldAttentionCache, HeldStep
from macbatch.engine.model.hooks import long_rope
from macbatch.engine.model.hooks.latent_attention import latent_modules
from macbatch.engine.model.hooks.pooled_sparse_attention import is_pooled_attention
from macbatch.engine.model.hooks.reused_kv import handed_kv
from macbatch.engine.model.kv_probe import (
    Layout,
    ProbeCache,
    UnsupportedModelError,
    layout_of,
    probing,
    refused_if_unreadable,
)
from macbatch.engine.model.paged_cache import PagedLayerCache
from macbatch.engine.model.pool_indexer import selection_plan
from macbatch.engine.model.recurrent import PagedStateCache
from macbatch.engine.model.state_calls import StateCache
from macbatch.engine.stores.held_caches import PLACEHOLDER, HeldCaches
from macbatch.engine.stores.pages import KVStores, LayerShape
from macbatch.engine.stores.state_store import StateShape, StateStore

_INNER_NAMES = ("model", "transformer", "backbone")
_TEXT_MODEL_NAME = "language_model"
# The token id an image row goes in as: read by nothing but the embedding lookup (which the image
# embedding replaces) and Gemma 4's per-layer inputs, which mlx-vlm's gemma4 takes from id 0 (its
# pad id) for image rows.
IMAGE_ROW_TOKEN = 0


class _Delegate:
    """Answers every attribute from ``target`` except the ones it overrides."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __contains__(self, name: str) -> bool:  # RecurrentGemma asks ``"lm_head" in self``
        return name in self._target


class _PrecomputedInner(_Delegate):
    """The inner transformer, except that calling it returns states computed already."""

    def __init__(self, inner: nn.Module, hidden: mx.array) -> None:
        super().__init__(inner)
        self._hidden = hidden

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        return self._hidden


class _HiddenStatesOnly(_Delegate):
    """Stands in for the model so its own ``__call__`` applies just the head to given states."""

    def __init__(self, model: nn.Module, inner_name: str, hidden: mx.array) -> None:
        super().__init__(model)
        setattr(self, inner_name, _PrecomputedInner(getattr(model, inner_name), hidden))


def text_model(model: nn.Module) -> nn.Module:
    """The model that turns token ids into logits: a multimodal wrapper's ``language_model``, or
    the model itself."""
    inner = getattr(model, _TEXT_MODEL_NAME, None)
    return inner if isinstance(inner, nn.Module) else model


def model_type_of(model: nn.Module) -> str:
    """The checkpoint's ``model_type`` (a wrapper's own, e.g. gemma3, not its text model's), or
    the mlx-lm module that runs it where mlx-lm chose that by its architecture
    (``families.checkpoint_type``)."""
    module = type(model).__module__.rsplit(".", 1)[-1]
    model_type = getattr(getattr(model, "args", None), "model_type", None) or getattr(
        model, "model_type", module
    )
    return module if module in remapped_types(str(model_type)) else library_type(str(model_type))


class ModelAdapter:
    """``model``: what ``mlx_lm.load`` returns (a text model, or a multimodal wrapper)."""

    def __init__(self, model: nn.Module, windows: bool = True) -> None:
        """``windows``: sliding-window layers get their own cache group holding only the window
        (False: every attention layer in the full group, as a distributed group needs)."""
        self.model_type = model_type_of(model)
        self.family = family(self.model_type)
        reason = unsupported_reason(self.model_type)
        if reason:
            raise UnsupportedModelError(
                f"model type '{self.model_type}' is not supported by macbatch's paged engine: "
                f"{reason}"
            )
        self.wrapper = model
        self.model = model = text_model(model)
        judge = self.family.config_refusal
        reason = None if judge is None else judge(getattr(model, "args", None))
        if reason:
            raise UnsupportedModelError(
                f"this '{self.model_type}' config is not supported by macbatch's paged engine: "
                f"{reason}"
            )
        inner_name = next(
            (n for n in _INNER_NAMES if isinstance(getattr(model, n, None), nn.Module)), None
        )
        if inner_name is None and not is_flat(model):
            raise UnsupportedModelError(
                f"model type '{self.model_type}' has no inner transformer named "
                f"{' / '.join(_INNER_NAMES)} and no decoder layers and LM head of its own; "
                "macbatch cannot pack its forward"
            )
        # None: a flat model, its own forward without its head packed (``flat_model.py``)
        self.inner_name: str | None = inner_name
        self._flat = None if inner_name else FlatTransformer(model, _head_call(type(model)))
        with refused_if_unreadable(self.model_type):
            self.recurrent, self.cache_lists, self.chunks = self._recurrent_caches()
            capped = self._named_modules(self.family.inline_softcap_attention)
            offsets = self._named_modules(self.family.scalar_offset_attention)
            ropes = self._named_modules(self.family.offset_rope_attention)
            reused = self._named_modules(self.family.reused_kv_attention)
            recurrent = self._recurrent_modules()
            hooks.install(self.layers, recurrent, capped, self.inner, offsets, ropes, reused)
            layout, self.state_shapes = self._probe()
        # a LongRoPE's original positions: each step then carries its rows' prompt lengths
        self.long_rope_after = long_rope.original_positions(self.layers)
        self.layer_shapes, self.kv_layers = layout.shapes, layout.kv_layers
        self.kv_dtype, self.head_orders = layout.dtype, layout.head_orders
        self.index_layers = layout.index_layers or [None] * len(self.kv_layers)
        self.indexer = layout.indexer
        store_windows = layout.windows
        # A hybrid model keeps every attention layer in the full group: its prefix cache resumes
        # at recurrent checkpoints, which a window group's cache would have to match as well.
        self.window, self.kv_slots = cache_groups(store_windows, windows and not self.state_shapes)
        # a model layer writes K/V when it is the first to use its store layer
        self.kv_writes = [self.kv_layers.index(kv) == i for i, kv in enumerate(self.kv_layers)]
        self._embeddings_as = _embeddings_keyword(self._flat._call if self._flat else self.inner)

    @property
    def inner(self) -> Any:
        """What the adapter packs: the inner transformer, or a flat model without its head."""
        return self._flat if self.inner_name is None else getattr(self.model, self.inner_name)

    @property
    def layers(self) -> list[nn.Module]:
        """The decoder layers: the model's ``layers``, or its inner transformer's where the
        model does not expose them (Kimi K2.5's and Kimi-VL's text model)."""
        layers = getattr(self.model, "layers", None)
        return list(layers if layers is not None else self.inner.layers)

    @property
    def head_is_split(self) -> bool:
        """Whether mlx-lm's ``shard`` split the LM head by vocabulary (its logits are gathered
        across the ranks: every rank must apply it)."""
        return getattr(self.model, "sharding_group", None) is not None

    @property
    def hybrid(self) -> bool:
        """Whether some layers keep recurrent state (Gated DeltaNet, Mamba, short convolutions)."""
        return bool(self.state_shapes)

    def _recurrent_caches(
        self,
    ) -> tuple[list[tuple[int, ...]], list[bool], list[int | None]]:
        """What the model's forward is handed as its cache list, one tuple per entry with one
        number per part (a ``CacheList`` has several; Falcon-H1's: the SSM's, then attention's):
        0 for attention (K/V), the number of state arrays for a recurrent layer's (a hybrid
        model's list is mlx-lm's ``make_cache()``), whether each entry is a ``CacheList``
        (the layer indexes it, even with one part: MiniMax M3's), and each part's attention
        chunk (a ``ChunkedKVCache``'s: Llama 4's chunked layers; None: it attends to every
        position); refuses any other kind with the reason."""
        # the text model's caches, or its wrapper's where only the wrapper makes them (MiniMax M3)
        maker = next((m for m in (self.model, self.wrapper) if hasattr(m, "make_cache")), None)
        made = [] if maker is None else maker.make_cache()
        if self.holds_caches:  # one placeholder per layer: the caches are held beside it
            return [(len(PLACEHOLDER.shapes),)] * len(made), [False] * len(made), [None] * len(made)
        # attention only: a cache for each layer (Gemma 4's KV-shared layers get one too,
        # where mlx-lm hands them None and the K/V array), or each of make_cache's where it
        # makes more (IQuest-Loop-Coder's second loop has its own); none for a layer handed
        # another layer's K/V as arrays (AFM 7's KV-reuse layers: the inner model reads them
        # from its last cache)
        reused = handed_kv(self._named_modules(self.family.reused_kv_attention))
        cached = len(self.layers) - len(reused)
        attention_only: list[tuple[int, ...]] = [(0,)] * max(cached, len(made))
        entries: list[tuple[int, ...]] = []
        lists: list[bool] = []
        chunks: list[int | None] = []
        for cache in made:
            listed = type(cache) in _kinds("CacheList")
            parts = cache.caches if listed else (cache,)
            sizes: list[int] = []
            # GLM5-next's sparse layer: its parts (a PoolingCache among them) are one engine cache
            pooled = is_pooled_attention(self._attention(len(entries)))
            for part in parts:
                chunked = type(part) in _kinds("ChunkedKVCache")
                chunks.append(int(part.chunk_size) if chunked else None)
                if (
                    chunked
                    or pooled
                    or type(part) in _kinds("KVCache", "RotatingKVCache") + _plain_kv_kinds()
                ):
                    sizes.append(0)
                elif type(part) in _kinds("ArraysCache"):
                    sizes.append(len(part.cache))
                else:
                    raise UnsupportedModelError(
                        f"model type '{self.model_type}' keeps {type(part).__name__} state; "
                        "macbatch pages attention K/V and keeps recurrent (ArraysCache) state "
                        "per request"
                    )
            if listed and self._latent_list(len(entries), sizes):
                # a sparse MLA layer's (latent, indexer keys), or Hunyuan V4's shared layer's
                # (latent alone): one engine cache is every part (``EngineAttention.__getitem__``),
                # the keys its own store layer
                sizes, listed = [0], False
                del chunks[len(chunks) - len(parts) + 1 :]
            if sizes.count(0) > 1 and not self._attentions_in(len(entries), sizes.count(0)):
                raise UnsupportedModelError(
                    f"model type '{self.model_type}' keeps {sizes.count(0)} K/V caches in one "
                    "layer (an indexer's keys, or two attentions); macbatch pages one per layer"
                )
            if 0 in sizes and any(sizes) and not self.family.side_by_side_mixer:
                raise UnsupportedModelError(
                    f"model type '{self.model_type}' keeps recurrent state inside its attention "
                    "layers (an ArraysCache beside the K/V in one CacheList) with no mixer the "
                    "engine runs apart; macbatch's packed rows do not carry that state"
                )
            entries.append(tuple(sizes))
            lists.append(listed)
        if not any(any(e) for e in entries) and not any(lists):
            padded = chunks + [None] * (len(attention_only) - len(chunks))
            return attention_only, [False] * len(attention_only), padded
        return entries, lists, chunks

    def _named_modules(self, name: str | None) -> list[nn.Module]:
        """Each decoder layer's module ``name`` (a family record's), none without a name."""
        return [getattr(layer, name) for layer in self.layers] if name else []

    def _recurrent_modules(self) -> list[nn.Module]:
        """The modules handed a recurrent state cache: every decoder layer of a hybrid model, or
        the mixer of each layer that keeps state where the family names one (Falcon-H1's beside
        its attention, Kimi K3's in place of it; none: attention only)."""
        if not any(any(entry) for entry in self.recurrent):
            return []
        mixer = self.family.side_by_side_mixer or self.family.held_cache_attention
        layers = self.layers
        if not mixer:
            return list(layers)
        return [getattr(layer, mixer) for layer, entry in zip(layers, self.recurrent) if any(entry)]

    def _probe(self) -> tuple[Layout, list[StateShape]]:
        """The pages' layout (``kv_probe.Layout``) and each recurrent layer's state shapes, from
        one forward that is never evaluated; marks the attention caches the forward never
        touches (``kv_used``: a cache list longer than the layers that use it)."""
        if self.holds_caches:  # no pages: every layer's cache is held (``HeldCaches``)
            self.kv_used = []
            dtype = self.inner.embed_tokens.weight.dtype
            return Layout([], [], dtype, [], []), [PLACEHOLDER] * len(self.recurrent)
        with probing(self.model_type) as peers:
            caches: list[ProbeCache | StateCache] = [
                StateCache(size) if size else ProbeCache(peers)
                for e in self.recurrent
                for size in e
            ]
            self.run_inner(mx.array([[0]]), mx.array([0]), cache=self._nested(caches))
        attention = [c for c in caches if isinstance(c, ProbeCache)]
        self.kv_used = [c.shape is not None or bool(c.reads) for c in attention]
        attention = [c for c, used in zip(attention, self.kv_used) if used]
        states = [_state_shape(c) for c in caches if isinstance(c, StateCache)]
        if not attention:  # recurrent only (Mamba, RWKV-7): the full group holds no pages
            if not states:
                raise UnsupportedModelError(
                    f"model type '{self.model_type}' showed neither an attention layer nor "
                    "recurrent state in a one-token forward; macbatch cannot cache it"
                )
            return Layout([], [], states[0].dtypes[0], [], []), states
        return layout_of(attention, self.model_type), states

    def _attention(self, entry: int) -> Any:
        return getattr(self.layers[entry], "self_attn", None) if entry < len(self.layers) else None

    def _attentions_in(self, entry: int, parts: int) -> bool:
        """Whether layer ``entry`` has ``parts`` MLA attentions, one for each K/V part of its
        ``CacheList`` (LongCat Flash's two): each part is a store layer of its own."""
        layers = self.layers
        return entry < len(layers) and len(latent_modules(layers[entry])) == parts

    def _indexed(self, entry: int) -> bool:
        """Whether layer ``entry``'s attention selects its rows with a lightning indexer."""
        return getattr(self._attention(entry), "indexer", None) is not None

    def _latent_list(self, entry: int, sizes: list[int]) -> bool:
        """Whether layer ``entry``'s ``CacheList`` of K/V parts ``sizes`` is one sparse MLA
        layer's: its latent and its indexer's keys, or its latent alone (a layer that reads the
        selection of the one before it, Hunyuan V4's "shared" layers)."""
        if is_pooled_attention(self._attention(entry)):
            return True
        if sizes == [0, 0]:
            return self._indexed(entry)
        return sizes == [0] and getattr(self._attention(entry), "skip_topk", False)

    @property
    def holds_caches(self) -> bool:
        """Whether its attention keeps the library's own caches, held per request slot
        (``HeldCaches``: DeepSeek V4)."""
        return self.family.held_cache_attention is not None

    def library_caches(self) -> list[Any]:
        """The library's caches for one new request: the family's kind (DeepSeek V4's, kept as
        its reference keeps them), else the model's own (mlx-lm's ``make_prompt_cache``)."""
        make = self.family.held_caches
        if make is not None:
            return make(self.model)
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    @property
    def chunked(self) -> bool:
        """Whether some layers attend within fixed chunks of positions (Llama 4)."""
        return any(chunk is not None for chunk in self.chunks)

    def check_block_size(self, block_size: int) -> None:
        """Refuses pages of ``block_size`` tokens that a chunk of a chunked layer does not fill
        whole (a chunk starts a block table: ``attention_chunks.py``)."""
        uneven = sorted({c for c in self.chunks if c is not None and c % block_size})
        if uneven:
            raise UnsupportedModelError(
                f"model type '{self.model_type}' attends in chunks of {uneven[0]} positions, not "
                f"a whole number of {block_size}-token KV blocks; choose a block size that "
                "divides it (EngineConfig.block_size)"
            )

    @property
    def sparse(self) -> bool:
        """Whether some layers select their rows with a lightning indexer (DeepSeek V3.2)."""
        return self.indexer is not None

    def run_inner(self, inputs: mx.array, positions: mx.array, **kwargs: Any) -> mx.array:
        """The inner transformer on ``inputs`` (their ``positions``: ``[N]``, or ``[N, 3]``
        M-RoPE ones), handed a mask where it asks for one by name without a default
        (Phixtral's, whose model makes it from the first cache: for the engine's caches that is
        the whole causal sequence, the kernels' own rule), and position ids where its family
        takes them (``Family.position_id_axes``)."""
        axes = self.family.position_id_axes
        if axes is not None:
            kwargs["position_ids"] = _position_ids(positions, axes)
        if self._needs_mask is None:
            parameter = inspect.signature(self.inner).parameters.get("mask")
            self._needs_mask = parameter is not None and parameter.default is parameter.empty
        if self._needs_mask:
            kwargs.setdefault("mask", None)
        return self.inner(inputs, **kwargs)

    _needs_mask: bool | None = None

    def _nested(self, caches: list[Any]) -> list[Any]:
        """The flat per-part ``caches`` regrouped as the model's cache list: a ``CacheList``
        entry as a list the layer indexes."""
        parts = iter(caches)
        grouped = [[next(parts) for _ in entry] for entry in self.recurrent]
        return [g if listed else g[0] for g, listed in zip(grouped, self.cache_lists)]

    @property
    def group_shapes(self) -> tuple[list[LayerShape], list[LayerShape]]:
        """The page shapes of the full group's layers and of the window group's."""
        groups: tuple[list[LayerShape], list[LayerShape]] = ([], [])
        for shape, (windowed, _) in zip(self.layer_shapes, self.kv_slots):
            groups[windowed].append(shape)
        return groups

    def hidden_states(
        self, batch: PackedBatch, stores: KVStores, states: StateStore | None = None
    ) -> mx.array:
        """The last layer's normed hidden states ``[N, 1, H]`` of one packed step, its K/V written
        into ``stores`` (and a hybrid model's recurrent state into ``states``): every layer and
        every collective of a step, without the LM head."""
        attention = iter(zip(self.kv_layers, self.kv_writes, self.head_orders, self.index_layers))
        plan = None
        if self.sparse:
            plan = selection_plan(self.indexer, batch.attention, stores.full.block_size)
        used = iter(self.kv_used)
        state_layers = iter(range(len(self.state_shapes)))
        positions = batch.positions if batch.rope_positions is None else batch.rope_positions
        long_rope.note_step(positions, batch.long_rope_rows)
        peers: list[PagedLayerCache] = []
        caches: list[PagedLayerCache | PagedStateCache | HeldAttentionCache | None] = []
        held = None
        if self.holds_caches:
            assert isinstance(states, HeldCaches) and batch.state_rows is not None
            held = HeldStep(states, batch.state_rows, self.library_caches)
        sizes = (size for entry in self.recurrent for size in entry)
        for size, chunk in zip(sizes, self.chunks, strict=True):
            if held is not None:
                caches.append(HeldAttentionCache(held, next(state_layers)))
            elif size:
                assert states is not None and batch.state_rows is not None
                layer = next(state_layers)
                caches.append(PagedStateCache(states, layer, batch.state_rows, positions))
            elif next(used):
                kv, writes, order, index = next(attention)
                cache = PagedLayerCache(stores, kv, batch, writes, peers, order, index, plan, chunk)
                caches.append(cache)
            else:
                caches.append(None)  # an entry no layer touches
        nested = self._nested(caches)
        inputs = batch.token_ids[:, None]
        if batch.image_rows is None or batch.image_embeddings is None:
            return self.run_inner(inputs, positions, cache=nested)
        return self._with_images(
            inputs, positions, nested, batch.image_rows, batch.image_embeddings
        )

    def _with_images(
        self,
        inputs: mx.array,
        positions: mx.array,
        cache: list[Any],
        rows: mx.array,
        images: mx.array,
    ) -> mx.array:
        """The text model on ``inputs`` (at ``positions``) whose ``rows`` take the image
        embeddings ``images``."""
        inner = self.inner
        embeddings = inner.embed_tokens(inputs)
        inputs[rows] = IMAGE_ROW_TOKEN
        # the first H columns: more are a Qwen3-VL image's DeepStack features (deepstack.py)
        image = images[:, None, : embeddings.shape[-1]]
        vision, named = self.family.vision, self._embeddings_as
        if vision is None or not vision.scaled_rows:
            embeddings[rows] = image.astype(embeddings.dtype)
            return self.run_inner(inputs, positions, cache=cache, **{named: embeddings})
        # the token rows scaled as the model scales them (the same op), the image rows as they
        # come, and the model's own scaling made 1.0 for this call (restored: the graph is built)
        scale = inner.embed_scale
        embeddings = embeddings * scale
        embeddings[rows] = image.astype(embeddings.dtype)
        inner.embed_scale = 1.0
        try:
            return self.run_inner(inputs, positions, cache=cache, **{named: embeddings})
        finally:
            inner.embed_scale = scale

    def forward(
        self, batch: PackedBatch, stores: KVStores, states: StateStore | None = None
    ) -> mx.array | None:
        """Logits ``[R, V]`` (float32) for the sampled rows of one packed step (None when no row
        is sampled: the step only writes K/V)."""
        return self.sampled_logits(self.hidden_states(batch, stores, states), batch)

    def sampled_logits(self, hidden: mx.array, batch: PackedBatch) -> mx.array | None:
        """The LM head on a step's sampled rows of ``hidden`` (None when it samples none)."""
        if batch.sample_rows.size == 0:
            return None
        if batch.sample_rows.size < batch.num_tokens:  # else every row, in order: no gather
            hidden = hidden[batch.sample_rows]
        return self.head(hidden)

    def head(self, hidden: mx.array) -> mx.array:
        """Logits ``[R, V]`` (float32) of normed hidden states ``[R, 1, H]``, through the model's
        own ``__call__`` (tied embeddings, logit scaling and softcaps stay the architecture's),
        or a flat model's LM head."""
        if self.inner_name is None:
            out = self.model.lm_head(hidden)
        else:
            stand_in = _HiddenStatesOnly(self.model, self.inner_name, hidden)
            inputs = mx.zeros(hidden.shape[:2], dtype=mx.int32)  # unread
            out = _head_call(type(self.model))(stand_in, inputs)
        # mlx-vlm's language models return their logits in an output record
        logits = getattr(out, "logits", out)[:, -1, :]
        return logits if logits.dtype == mx.float32 else logits.astype(mx.float32)


def cache_groups(
    windows: list[int | None], enabled: bool
) -> tuple[int | None, list[tuple[bool, int]]]:
    """The window group's window (None: no window group) and, per store layer, whether it is in
    the window group and its index in its group. Layers with a sliding window form the window
    group (its window the largest of theirs), the rest the full group; only when ``enabled`` and
    some layer sees the whole sequence (the full group's block table carries the prefix cache)."""
    sliding = [enabled and w is not None for w in windows]
    if all(sliding):
        sliding = [False] * len(windows)
    counts = [0, 0]
    slots = []
    for windowed in sliding:
        slots.append((windowed, counts[windowed]))
        counts[windowed] += 1
    window = max((w for w, s in zip(windows, sliding) if s and w is not None), default=None)
    return window, slots


@functools.cache
def _head_call(cls: type) -> Callable[..., Any]:
    """``cls.__call__``, or where it calls ``super()`` (which needs a real instance, not the
    head's stand-in: Qwen4-exp's, adding hidden-state keywords to Qwen3.5's) the first of its
    bases' that does not."""
    calls = (klass.__dict__.get("__call__") for klass in cls.__mro__)
    return next(c for c in calls if c is not None and "__class__" not in c.__code__.co_freevars)


def _embeddings_keyword(call: Callable[..., Any]) -> str:
    """The keyword ``call`` takes its input embeddings by: mlx-lm's ``input_embeddings``, or
    mlx-vlm's own text models' ``inputs_embeds`` (Idefics 3's, LLaVA-NeXT's ...)."""
    parameters = inspect.signature(call).parameters
    return "inputs_embeds" if "inputs_embeds" in parameters else "input_embeddings"


def _position_ids(positions: mx.array, axes: int) -> mx.array:
    """Rows' ``positions`` (``[N]``, or ``[N, 3]`` M-RoPE ones) as the position ids of N
    one-token rows: ``[N, 1]`` (one axis), or ``[3, N, 1]`` (M-RoPE's, a text row's three parts
    its position)."""
    if axes == 1:
        return positions.reshape(-1, 1)
    parts = positions.T if positions.ndim == 2 else mx.broadcast_to(positions, (3, positions.size))
    return parts[:, :, None]


def _kinds(*names: str) -> tuple[type, ...]:
    """mlx-lm's cache classes ``names``, and mlx-vlm's of those names once it is loaded (the
    families whose text model is its make its caches)."""
    from mlx_lm.models import cache

    homes = (cache, sys.modules.get("mlx_vlm.models.cache"))
    return tuple(getattr(home, name) for home in homes if home is not None for name in names)


def _plain_kv_kinds() -> tuple[type, ...]:
    """mlx-vlm's ``KVCache`` subclasses that keep plain K/V (loaded ones only): Hunyuan V4's,
    which only allocates its indexer keys' zero-width values and sizes its memory apart, and
    Qwen4-exp's, which keeps its block indexer's keys beside them (the engine pages those as a
    store layer of their own, ``hooks/block_sparse_attention.py``)."""
    homes = (("mlx_vlm.models.hy_v4.cache", "HyV4KVCache"),
             ("mlx_vlm.models.qwen4_exp.language", "QSAKVCache"))  # fmt: skip
    loaded = ((sys.modules.get(module), name) for module, name in homes)
    return tuple(getattr(home, name) for home, name in loaded if home is not None)


def _state_shape(cache: Any) -> StateShape:
    """A recurrent layer's state as its probe left it (batch axis dropped)."""
    if any(a is None for a in cache.cache):
        raise UnsupportedModelError("a recurrent layer kept no state in a one-token forward")
    return StateShape(tuple(a.shape[1:] for a in cache.cache), tuple(a.dtype for a in cache.cache))
