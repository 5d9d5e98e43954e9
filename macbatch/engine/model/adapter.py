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
K/V (Gemma 4's KV-shared layers) are found during the probe and read the source layer's pages, so
the pool holds one set of pages per layer mlx-lm keeps a cache for.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_base

import macbatch.metal
from macbatch.engine.model import hooks
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.families import family, unsupported_reason
from macbatch.engine.model.hooks.attention import EngineAttention
from macbatch.engine.model.image_blocks import attend_blocks
from macbatch.engine.model.recurrent import PagedStateCache
from macbatch.engine.stores.pages import KVStore, KVStores, LayerShape
from macbatch.engine.stores.state_store import StateShape, StateStore

_INNER_NAMES = ("model", "transformer", "backbone")
_TEXT_MODEL_NAME = "language_model"
# The token id an image row goes in as: read by nothing but the embedding lookup (which the image
# embedding replaces) and Gemma 4's per-layer inputs, which mlx-vlm's gemma4 takes from id 0 (its
# pad id) for image rows.
IMAGE_ROW_TOKEN = 0


class UnsupportedModelError(ValueError):
    """The model's architecture cannot be served through the paged engine."""


class PagedLayerCache(EngineAttention):
    """The per-layer cache object a model sees during a packed forward: its cache group's pages,
    write rows and block tables (a sliding-window layer's group holds only the window)."""

    def __init__(self, stores: KVStores, layer: int, batch: PackedBatch, writes: bool) -> None:
        windowed, self.layer = stores.slots[layer]  # the group's layer whose pages it reads
        store = stores.window if windowed else stores.full
        assert store is not None
        self.store: KVStore = store
        self.rows = batch.window_write_rows if windowed else batch.kv_write_rows
        self.batch = batch
        self.windowed = windowed
        self.writes = writes  # False for a layer that reuses an earlier layer's K/V
        self.offset = batch.positions if batch.rope_positions is None else batch.rope_positions

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.writes:
            assert self.rows is not None
            rows = self.rows[self.store.shapes[self.layer].num_kv_heads]
            self.store.write(self.layer, rows, keys, values)
        return keys, values

    def attend(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        scale: float,
        window: int | None,
        sinks: Any,
        softcap: float | None = None,
    ) -> mx.array:
        """The layer's paged attention (its K/V are in the pages by now)."""
        k_pages, v_pages = self.store.pages(self.layer)
        layer = macbatch.metal.LayerParams(scale, window, softcap, sinks)
        meta = self.batch.window_attention if self.windowed else self.batch.attention
        out = macbatch.metal.paged_attention(queries[:, :, 0, :], k_pages, v_pages, meta, layer)
        if self.batch.image_blocks is not None:  # Gemma 4: image rows attend both ways
            pages = (k_pages, v_pages)
            blocks = self.batch.image_blocks
            out = attend_blocks(out, queries[:, :, 0, :], pages, meta.block_tables, blocks, layer)
        return out[:, :, None, :]

    def attend_latent(
        self, queries: mx.array, row: mx.array, scale: float, value_dim: int
    ) -> mx.array:
        """An MLA layer's attention over its latent pages, this step's rows written first."""
        if self.writes:
            assert self.rows is not None
            self.store.write(self.layer, self.rows[1], row, None)
        k_pages, v_pages = self.store.pages(self.layer)
        layer = macbatch.metal.LayerParams(scale, value_dim=value_dim)
        out = macbatch.metal.paged_attention(
            queries[:, :, 0, :], k_pages, v_pages, self.batch.attention, layer
        )
        return out[:, :, None, :]


class _ProbeCache(EngineAttention):
    """Records what one layer does during a one-token forward, to learn the cache shapes and to
    prove attention goes through the patched name."""

    def __init__(self) -> None:
        self.offset = mx.array([0], dtype=mx.int32)
        self.shape: LayerShape | None = None
        self.dtype: mx.Dtype | None = None
        self.keys: mx.array | None = None  # the very object handed in: shared K/V is the same one
        self.attended = 0
        self.window: int | None = None  # the sliding window its attention was handed

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.shape = LayerShape(num_kv_heads=keys.shape[1], head_dim=keys.shape[-1])
        self.keys = keys
        self.dtype = keys.dtype
        return keys, values

    def attend(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        scale: float,
        window: int | None,
        sinks: Any,
        softcap: float | None = None,
    ) -> mx.array:
        """Counts the call (each layer must attend once, through the hook) and its window."""
        self.attended += 1
        self.window = window
        return mlx_base.scaled_dot_product_attention(
            queries, keys, values, None, scale, None, sinks
        )

    def attend_latent(
        self, queries: mx.array, row: mx.array, scale: float, value_dim: int
    ) -> mx.array:
        """Records a latent layer's one-row pages; a lone token attends to itself alone, so
        every head's output is its row's values."""
        self.update_and_fetch(row, row)
        self.shape = LayerShape(1, row.shape[-1], value_dim=value_dim)
        self.attended += 1
        n, heads = queries.shape[:2]
        return mx.broadcast_to(row[..., :value_dim], (n, heads, 1, value_dim))


class _Delegate:
    """Answers every attribute from ``target`` except the ones it overrides."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


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
    """The checkpoint's ``model_type`` (a wrapper's own, e.g. gemma3, not its text model's)."""
    model_type = getattr(getattr(model, "args", None), "model_type", None) or getattr(
        model, "model_type", type(model).__module__.rsplit(".", 1)[-1]
    )
    return str(model_type)


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
        self.model = model = text_model(model)
        inner_name = next(
            (n for n in _INNER_NAMES if isinstance(getattr(model, n, None), nn.Module)), None
        )
        if inner_name is None:
            raise UnsupportedModelError(
                f"model type '{self.model_type}' has no inner transformer named "
                f"{' / '.join(_INNER_NAMES)}; macbatch cannot pack its forward"
            )
        self.inner_name: str = inner_name
        self.recurrent = self._recurrent_caches()
        softcapped = self.family.inline_softcap_attention
        capped = [getattr(layer, softcapped) for layer in self.layers] if softcapped else []
        hooks.install(self.layers, self._recurrent_modules(), capped)
        self.layer_shapes, self.kv_layers, self.kv_dtype, self.state_shapes, store_windows = (
            self._probe()
        )
        # A hybrid model keeps every attention layer in the full group: its prefix cache resumes
        # at recurrent checkpoints, which a window group's cache would have to match as well.
        self.window, self.kv_slots = cache_groups(store_windows, windows and not self.state_shapes)
        # a model layer writes K/V when it is the first to use its store layer
        self.kv_writes = [self.kv_layers.index(kv) == i for i, kv in enumerate(self.kv_layers)]

    @property
    def inner(self) -> nn.Module:
        return getattr(self.model, self.inner_name)

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

    def _recurrent_caches(self) -> list[tuple[int, ...]]:
        """What the model's forward is handed as its cache list, one tuple per entry with one
        number per part (a ``CacheList`` has several; Falcon-H1's: the SSM's, then attention's):
        0 for attention (K/V), the number of state arrays for a recurrent layer's (a hybrid
        model's list is mlx-lm's ``make_cache()``); refuses any other kind with the reason."""
        from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

        attention_only: list[tuple[int, ...]] = [(0,)] * len(self.layers)
        if not hasattr(self.model, "make_cache"):
            return attention_only
        entries = []
        for cache in self.model.make_cache():
            parts = cache.caches if type(cache) is CacheList else (cache,)
            sizes = []
            for part in parts:
                if type(part) in (KVCache, RotatingKVCache):
                    sizes.append(0)
                elif type(part) is ArraysCache:
                    sizes.append(len(part.cache))
                else:
                    raise UnsupportedModelError(
                        f"model type '{self.model_type}' keeps {type(part).__name__} state; "
                        "macbatch pages attention K/V and keeps recurrent (ArraysCache) state "
                        "per request"
                    )
            entries.append(tuple(sizes))
        if not any(any(e) for e in entries):  # attention only: one cache per layer
            return attention_only
        return entries

    def _recurrent_modules(self) -> list[nn.Module]:
        """The modules handed a recurrent state cache: every decoder layer of a hybrid model, or
        the mixer beside each layer's attention where the family has one (none: attention
        only)."""
        if not any(any(entry) for entry in self.recurrent):
            return []
        mixer = self.family.side_by_side_mixer
        layers = self.layers
        return [getattr(layer, mixer) for layer in layers] if mixer else list(layers)

    def _probe(
        self,
    ) -> tuple[list[LayerShape], list[int], mx.Dtype, list[StateShape], list[int | None]]:
        """Page shapes (one per layer that computes its own K/V), the store layer each attention
        layer reads, the K/V dtype, each recurrent layer's state shapes, and each store layer's
        sliding window (None: some layer reading it sees the whole sequence). A layer handed the
        very K/V array an earlier layer was handed reuses that layer's K/V, so it reads that
        layer's pages."""
        from mlx_lm.models.cache import ArraysCache

        caches: list[_ProbeCache | ArraysCache] = [
            ArraysCache(size) if size else _ProbeCache() for e in self.recurrent for size in e
        ]
        # shapes only: the graph is never evaluated
        self.inner(mx.array([[0]]), cache=_nested(self.recurrent, caches))
        probes = [c for c in caches if isinstance(c, _ProbeCache)]
        # a cache its layer never touched: the layer's attention is off or a linear map
        # (Nemotron-NAS), so it gets no pages, and a stand-in at run time (``hidden_states``)
        self.idle = {i for i, c in enumerate(probes) if c.shape is None and not c.attended}
        attention = [c for i, c in enumerate(probes) if i not in self.idle]
        if not attention:
            raise UnsupportedModelError(
                f"model type '{self.model_type}' is recurrent only (no attention layer); "
                "macbatch runs attention models and hybrids of attention and recurrent layers"
            )
        if not all(c.shape is not None and c.attended == 1 for c in attention):
            raise UnsupportedModelError(
                f"model type '{self.model_type}' does not route every layer's attention through "
                "mlx-lm's scaled_dot_product_attention; macbatch cannot page its KV cache"
            )
        states = [_state_shape(c) for c in caches if isinstance(c, ArraysCache)]
        shapes: list[LayerShape] = []
        kv_layers: list[int] = []
        owners: list[tuple[mx.array, int]] = []  # (K/V array, store layer) of computing layers
        windows: list[int | None] = []
        for cache in attention:
            assert cache.shape is not None and cache.keys is not None  # every layer attended
            store_layer = next((i for keys, i in owners if keys is cache.keys), None)
            if store_layer is None:
                store_layer = len(shapes)
                shapes.append(cache.shape)
                owners.append((cache.keys, store_layer))
                windows.append(cache.window)
            seen = windows[store_layer]
            windows[store_layer] = (
                None if seen is None or cache.window is None else max(seen, cache.window)
            )
            kv_layers.append(store_layer)
        assert attention[0].dtype is not None
        return shapes, kv_layers, attention[0].dtype, states, windows

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
        attention = iter(zip(self.kv_layers, self.kv_writes))
        state_layers = iter(range(len(self.state_shapes)))
        caches: list[PagedLayerCache | PagedStateCache] = []
        slots = 0
        for size in (size for entry in self.recurrent for size in entry):
            if size:
                assert states is not None and batch.state_rows is not None
                caches.append(PagedStateCache(states, next(state_layers), batch.state_rows))
            elif slots in self.idle:  # never read or written (the probe saw to it): its mask
                caches.append(PagedLayerCache(stores, self.kv_layers[0], batch, False))
            else:
                kv, writes = next(attention)
                caches.append(PagedLayerCache(stores, kv, batch, writes))
            slots += not size
        nested = _nested(self.recurrent, caches)
        inputs = batch.token_ids[:, None]
        if batch.image_rows is None or batch.image_embeddings is None:
            return self.inner(inputs, cache=nested)
        return self._with_images(inputs, nested, batch.image_rows, batch.image_embeddings)

    def _with_images(
        self, inputs: mx.array, cache: list[Any], rows: mx.array, images: mx.array
    ) -> mx.array:
        """The text model on ``inputs`` whose ``rows`` take the image embeddings ``images``."""
        inner = self.inner
        embeddings = inner.embed_tokens(inputs)
        inputs[rows] = IMAGE_ROW_TOKEN
        # the first H columns: more are a Qwen3-VL image's DeepStack features (deepstack.py)
        image = images[:, None, : embeddings.shape[-1]]
        vision = self.family.vision
        if vision is None or not vision.scaled_rows:
            embeddings[rows] = image.astype(embeddings.dtype)
            return inner(inputs, cache=cache, input_embeddings=embeddings)
        # the token rows scaled as the model scales them (the same op), the image rows as they
        # come, and the model's own scaling made 1.0 for this call (restored: the graph is built)
        scale = inner.embed_scale
        embeddings = embeddings * scale
        embeddings[rows] = image.astype(embeddings.dtype)
        inner.embed_scale = 1.0
        try:
            return inner(inputs, cache=cache, input_embeddings=embeddings)
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
        own ``__call__`` (tied embeddings, logit scaling and softcaps stay the architecture's)."""
        stand_in = _HiddenStatesOnly(self.model, self.inner_name, hidden)
        inputs = mx.zeros(hidden.shape[:2], dtype=mx.int32)  # unread
        logits = type(self.model).__call__(stand_in, inputs)[:, -1, :]
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


def _nested(entries: list[tuple[int, ...]], caches: list[Any]) -> list[Any]:
    """The flat per-part ``caches`` regrouped as the model's cache list: an entry of several
    parts (mlx-lm's ``CacheList``) as a list the layer indexes."""
    parts = iter(caches)
    grouped = [[next(parts) for _ in entry] for entry in entries]
    return [group[0] if len(group) == 1 else group for group in grouped]


def _state_shape(cache: Any) -> StateShape:
    """A recurrent layer's state as its probe left it (batch axis dropped)."""
    if any(a is None for a in cache.cache):
        raise UnsupportedModelError("a recurrent layer kept no state in a one-token forward")
    return StateShape(tuple(a.shape[1:] for a in cache.cache), tuple(a.dtype for a in cache.cache))
