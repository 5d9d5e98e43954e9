"""The model runner: everything a step needs on the device, and nothing about requests.

It owns the model (cast and sharded as settled at load), its adapter, the memory of each cache
group (KV pages and recurrent states, sized here from free memory and declared with each
group's spec in ``cache_groups``; the KV manager's groups grow them: kv/elastic.py), the packing
of a step over the groups' tables, the forward, the constraint masks and sampling, and the
dispatch of a step (``mx.async_eval``; a distributed rank 0 broadcasts the packed batch first
and evaluates each step before the next). It is built from the model and an ``EngineConfig``
alone: a distributed follower runs one with no tokenizer, scheduler or engine
(docs/distributed.md), and the engine core composes one with its scheduler and KV manager
(docs/engine.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

import macbatch.metal
from macbatch.arithmetic import ceil_div
from macbatch.engine.config import EngineConfig
from macbatch.engine.core.packing import pack
from macbatch.engine.kv.elastic import PagedMemory, pool_size
from macbatch.engine.kv.full import FullAttentionSpec
from macbatch.engine.kv.group import CacheSpec, StepTables
from macbatch.engine.kv.held_state import HeldStateSpec
from macbatch.engine.kv.indexer_keys import IndexerKeysSpec
from macbatch.engine.kv.latent import LatentSpec
from macbatch.engine.kv.recurrent_state import RecurrentStateSpec
from macbatch.engine.kv.state_slots import StateMemory, state_sizes
from macbatch.engine.kv.window import SlidingWindowSpec
from macbatch.engine.lora.bank import AdapterBank
from macbatch.engine.model.adapter import ModelAdapter
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.compute_dtype import parameter_arrays, settle_compute_dtype
from macbatch.engine.model.kv_probe import UnsupportedModelError
from macbatch.engine.model_info import context_length, declared_context_length
from macbatch.engine.multimodal.vision import FROM_A_MODEL_OBJECT, VisionSupport, vision_for
from macbatch.engine.pooling.methods import Pools, PoolSpan
from macbatch.engine.sample.sampler import SampledBatch, sample
from macbatch.engine.speculative.dflash_model import DFlashModel
from macbatch.engine.speculative.dflash_runner import DFlashRunner
from macbatch.engine.speculative.draft_runner import DraftRunner, JointPages
from macbatch.engine.speculative.drafter_pages import DrafterPages, TappedDrafter
from macbatch.engine.speculative.eagle3_model import Eagle3Model
from macbatch.engine.speculative.eagle3_runner import Eagle3Runner
from macbatch.engine.speculative.mtp_model import MtpHead
from macbatch.engine.speculative.mtp_runner import MtpRunner
from macbatch.engine.stores.held_caches import HeldCaches
from macbatch.engine.stores.pages import KVStore, KVStores, PageFormat
from macbatch.engine.stores.state_store import StateStore, slot_stride
from macbatch.engine.worker import host_memory
from macbatch.engine.worker.compiled_step import compiled_decode
from macbatch.engine.worker.ranks import Followers, Ranks

if TYPE_CHECKING:
    from macbatch.engine.core.request import Request
    from macbatch.engine.core.scheduler import StepPlan
    from macbatch.engine.kv.block_pool import BlockPool
    from macbatch.engine.kv.manager import KVManager
    from macbatch.engine.speculative.verify import DraftRow
    from macbatch.engine.structured_output.constraints import ConstraintCompiler


class ModelRunner:
    """One model's forward over a paged KV pool. Not thread-safe: the engine thread's only."""

    def __init__(
        self,
        model: nn.Module,
        config: EngineConfig,
        owns_model: bool = False,
        ranks: Ranks | None = None,
        draft: nn.Module | MtpHead | None = None,
        vision_from: str | None = None,
    ) -> None:
        """``owns_model``: the engine loaded ``model`` itself and may cast it for the backend.
        ``ranks``: the ranks that share the model (``worker/ranks.py``; None: one process);
        each keeps its shard and pages its own KV heads, and the ranks agree on the smallest
        pool (a collective: every rank builds its runner at the same point). ``draft``: a draft
        model (rank 0's), whose pages share the full group's block ids
        (speculative/draft_runner.py), or a checkpoint's MTP layer, whose pages share them too
        and which reads the step's hidden states (speculative/mtp.py). ``vision_from``: the
        model name (as the loader resolves it) whose vision tower encodes a request's images
        (None: images are refused, the runner was built from a model object)."""
        self.config = config
        self.group = group = None if ranks is None else ranks.group
        host_memory.keep_step_buffers()
        self.compute_dtype = settle_compute_dtype(model, config.dtype, owns_model)
        if ranks is not None:
            ranks.shard(model)
        # A distributed step carries no window group (followers page every layer in full).
        self.adapter = ModelAdapter(model, windows=group is None)
        if group is not None and self.adapter.holds_caches:
            raise UnsupportedModelError(
                f"model type '{self.adapter.model_type}' keeps the library's own caches per "
                'request (docs/engine.md, "DeepSeek V4"), not yet run across a distributed group'
            )
        self.adapter.check_block_size(config.block_size)
        self.model = model = self.adapter.model  # a multimodal wrapper's: its language_model
        self.adapters = adapter_bank(model, config, ranks)  # fine-tunes beside the base weights
        self.model_type = self.adapter.model_type
        macbatch.metal.ensure_selftest()  # on Metal: prove the kernel before serving with it
        self.vocab_size = model_vocab_size(model)
        args = getattr(model, "args", None)  # mlx-lm's ModelArgs: a dataclass
        self.hidden_size = int(getattr(args, "hidden_size", 0) or 0)  # 0: not declared
        declared = declared_context_length(getattr(args, "__dict__", None) or {})
        self.context_length = context_length(declared, config.max_model_len)
        shapes = self.adapter.layer_shapes
        if config.indexer_keys and not any(s.indexer_keys for s in shapes):
            raise ValueError(
                f"indexer_keys={config.indexer_keys!r}: model type '{self.model_type}' has no "
                "lightning indexer whose keys it could hold"
            )
        fmt = PageFormat.of(self.adapter.kv_dtype, config)
        self.kv_bytes_per_token = fmt.bytes_per_block(shapes, 1)  # a bad group size fails here
        self.draft: DraftRunner | MtpRunner | DFlashRunner | Eagle3Runner | None = None
        if isinstance(draft, MtpHead):
            self.draft = MtpRunner(draft, self.adapter, config)
        elif isinstance(draft, DFlashModel):
            self.draft = DFlashRunner(draft, self.adapter, config)
        elif isinstance(draft, Eagle3Model):
            self.draft = Eagle3Runner(draft, self.adapter, config)
        elif draft is not None:
            self.draft = DraftRunner(draft, config, self.vocab_size, owns_model)
        # the last forward's hidden states, kept for an MTP layer (None: not kept)
        self.hidden: mx.array | None = None
        self._allocate_caches(model, config, fmt, ranks)
        # small decode steps' forward, compiled once enough of them ran (compiled_step.py)
        # (a drafter's features come from its hidden states or its tapped layers' outputs)
        self.compiled = compiled_decode(
            self.adapter,
            self.kv_stores,
            config.compile_decode_after,
            group is not None,
            keeps_hidden=isinstance(self.draft, DrafterPages),
            taps=self.draft.taps if isinstance(self.draft, TappedDrafter | MtpRunner) else None,
        )
        full_shapes, window_shapes = self.adapter.group_shapes
        self.kv_head_counts = {s.num_kv_heads for s in full_shapes}
        self.window_head_counts = {s.num_kv_heads for s in window_shapes}
        self.pools = Pools()  # pooling requests' running accumulators
        # Set by the engine (rank 0): the masks of constrained requests. A follower has none.
        self.constraints: ConstraintCompiler | None = None
        self._followers: Followers | None = None if ranks is None else ranks.followers()
        # the vision encoder, or why requests with images are refused (a launched group pages
        # text only: docs/vision.md)
        self.vision = (
            VisionSupport(refusal=FROM_A_MODEL_OBJECT)
            if vision_from is None
            else vision_for(vision_from, model, launched=ranks is not None)
        )

    def _allocate_caches(
        self,
        model: nn.Module,
        config: EngineConfig,
        fmt: PageFormat,
        ranks: Ranks | None,
    ) -> None:
        """Size and allocate the memory of each cache group the model needs, and declare them
        (``cache_groups``: each group's spec and memory, which the KV manager's groups keep); the
        pools start small and grow (``kv/elastic.py``)."""
        full_shapes, window_shapes = self.adapter.group_shapes
        full, window, states = cache_specs(self.adapter, fmt, config.block_size)
        cap, window_cap = self._caps(model, config, full, window, states)
        if ranks is not None:  # block ids mean the same on every rank: the smallest pool wins
            cap = ranks.smallest(cap)
        # A pinned size, or ranks that must agree on every block id: a fixed pool.
        fixed = config.num_blocks is not None or ranks is not None
        # both groups start with as many blocks as one pool of every layer would
        start_per_block = full.bytes_per_block + (0 if window is None else window.bytes_per_block)
        start_per_block += 0 if self.draft is None else self.draft.bytes_per_block
        self.pool_size = pool_size(cap, start_per_block, config, fixed)
        self.store = KVStore(full_shapes, self.pool_size.start, config.block_size, fmt)
        # what the full group's block ids address: the target's pages, and a draft's
        self.full_pages: KVStore | JointPages = self.store
        if self.draft is not None:
            self.full_pages = JointPages(self.store, self.draft.allocate(self.pool_size.start))
        self.cache_groups: list[tuple[CacheSpec, object]] = [
            (full, PagedMemory(self.full_pages, self.pool_size))
        ]
        # the window group never needs more blocks than the full group holds (``window_pool_cap``)
        self.window_store: KVStore | None = None
        if window is not None:
            size = pool_size(min(window_cap, cap), start_per_block, config, fixed)
            self.window_store = KVStore(window_shapes, size.start, config.block_size, fmt)
            self.cache_groups.append((window, PagedMemory(self.window_store, size)))
        self.kv_stores = KVStores(self.store, self.window_store, self.adapter.kv_slots)
        # a hybrid model's recurrent state: a slot per running request, taken on demand
        self.states: StateStore | None = None
        if states is not None:
            kv_bytes = cap * full.bytes_per_block
            sizes = state_sizes(config, states.bytes_per_state, kv_bytes, fixed)
            snapshots = verifies_drafts(config)
            rows = sizes.slots * slot_stride(snapshots) + sizes.checkpoints
            shapes = self.adapter.state_shapes
            if self.adapter.holds_caches:
                self.states = HeldCaches(shapes, rows, snapshots, self.adapter.library_caches)
            else:
                self.states = StateStore(shapes, rows, snapshots)
            self.cache_groups.append((states, StateMemory(self.states, sizes)))

    def _caps(
        self,
        model: nn.Module,
        config: EngineConfig,
        full: FullAttentionSpec,
        window: SlidingWindowSpec | None,
        states: RecurrentStateSpec | None,
    ) -> tuple[int, int]:
        """The full group's cap (``num_blocks``, or what the memory budget holds beside the
        window group's cap, the state slots' most and a draft) and the window group's (0: none)."""
        draft_per_block = 0 if self.draft is None else self.draft.bytes_per_block
        window_cap = 0
        reserved = 0
        if window is not None:
            window_cap = window_pool_cap(
                model, full.bytes_per_block, window.bytes_per_block, self, config
            )
            reserved += window_cap * window.bytes_per_block
        if states is not None:  # the state slots' most (they grow on demand: state_slots.py),
            # each with its rollback snapshot when drafts may be verified
            stride = slot_stride(verifies_drafts(config))
            reserved += config.max_num_seqs * stride * states.bytes_per_state
        if self.draft is not None:
            reserved += self.draft.weights_nbytes + self.draft.state_bytes_most
        cap = config.num_blocks or blocks_for_memory(
            model, full.bytes_per_block + draft_per_block, self.context_length, config, reserved
        )
        return cap, window_cap

    # -- a step (rank 0) ---------------------------------------------------------------------

    def pack(self, plan: StepPlan, tables: StepTables) -> PackedBatch:
        """The step's batch over each cache group's tables (the KV manager's), written to the
        pages of each group's KV heads."""
        window = None if tables.window is None else (tables.window, self.window_head_counts)
        return pack(
            plan,
            tables.blocks,
            self.config.block_size,
            self.kv_head_counts,
            tables.states,
            window,
            self.adapter.long_rope_after is not None,
        )

    def forward(
        self, batch: PackedBatch, spans: Sequence[PoolSpan] = ()
    ) -> tuple[mx.array | None, dict[str, mx.array]]:
        """The logits of the step's sampled rows (None when it samples none), and the results of
        the pooling requests whose last chunk this step computes (``spans``: the pooling
        requests' rows, folded into ``self.pools``); the other ranks of a group run the same
        forward on their shard."""
        # an MTP layer reads the hidden states, a DFlash or Eagle-3 drafter its target layers'
        keep = isinstance(self.draft, DrafterPages)
        if self._followers is not None:
            batch.reads_hidden = int(keep)  # ``launch`` evaluates them: so must the followers
            self._followers.send_step(batch)
        if self.adapters is not None:
            self.adapters.use(batch.adapter_rows)
        # a step with adapter rows is never compiled (its graph has the adapters' products)
        plain = not spans and batch.adapter_rows is None
        compiled = None if not plain or self.compiled is None else self.compiled.forward(batch)
        if compiled is not None:  # a small decode step: what a drafter reads returned too
            self.hidden = self._features(compiled.hidden)
            return compiled.logits, {}
        if not spans and not keep:
            return self.adapter.forward(batch, self.kv_stores, self.states), {}
        hidden = self.adapter.hidden_states(batch, self.kv_stores, self.states)
        self.hidden = self._features(hidden)
        pooled = self.pools.take(hidden, spans, self.adapter.head) if spans else {}
        return self.adapter.sampled_logits(hidden, batch), pooled

    def _features(self, hidden: mx.array | None) -> mx.array | None:
        """What the drafter keeps of a forward whose hidden states are ``hidden`` (its tapped
        layers' outputs are recorded already); None where no drafter reads them."""
        draft = self.draft
        if hidden is None or not isinstance(draft, DrafterPages):
            return None
        return draft.features(hidden)

    def sample(self, logits: mx.array, rows: Sequence[Request | DraftRow]) -> SampledBatch:
        """Mask the constrained rows' logits, then sample one token per row (``rows``: the
        requests of the logits' rows, in order; a verified draft's row is a ``DraftRow``)."""
        if self.constraints is not None:
            # A request that finished on the token just read samples a token nobody emits.
            states = [None if r.finished else r.constraint for r in rows]
            logits = self.constraints.mask_logits(logits, states, [r.num_generated for r in rows])
        return sample(logits, rows)

    def launch(self, result: SampledBatch | None, pooled: Sequence[mx.array] = ()) -> float:
        """Start the step on the device: its samples and the KV pages it writes. Returns the
        seconds spent blocked here (MLX blocks in ``async_eval`` when many ops are outstanding;
        a group's rank 0 evaluates the step before the next broadcast, docs/distributed.md)."""
        started = time.perf_counter()
        arrays = [
            *(result.arrays() if result else []),
            *self.kv_stores.arrays(),
            *self._state_arrays(),
            *pooled,
            *self.pools.arrays(),
        ]
        if self._followers is None:
            mx.async_eval(*arrays)
        else:  # every collective the followers make (``follow``), the hidden states' included
            mx.eval(*arrays, *([] if self.hidden is None else [self.hidden]))
            self._followers.step_finished()
        return time.perf_counter() - started

    def _state_arrays(self) -> list[mx.array]:
        return [] if self.states is None else self.states.arrays()

    def close(self) -> None:
        """Let the other ranks of a group exit; this runner must not run a step again."""
        if self._followers is not None:
            self._followers.send_stop()

    # -- what the pages hold (``Engine.stats``) ---------------------------------------------

    def kv_cache_bytes(self) -> int:
        """The whole pool's pages now, scales and a draft model's pages included."""
        draft = self.draft
        return self.kv_stores.nbytes + (0 if draft is None else draft.store.nbytes)

    def draft_bytes_used(self, pool: BlockPool) -> int:
        """The draft's pages in occupied blocks, and a hybrid draft's states in use."""
        draft = self.draft
        if draft is None:
            return 0
        return pool.num_occupied * draft.bytes_per_block + draft.state_bytes_used

    def kv_bytes_used(self, kv: KVManager) -> int:
        """What every cache group's memory holds (pages in occupied blocks, recurrent states in
        use: running requests' slots and the prefix cache's checkpoints), and the draft's."""
        return kv.bytes_used + self.draft_bytes_used(kv.pool)

    # -- a step (the other ranks) -----------------------------------------------------------

    def follow(self, batch: PackedBatch) -> None:
        """Rank 0's step on this rank's shard: the same layers, so the same collectives in the
        same order, and this rank's K/V (and recurrent state) written. Not the LM head, unless
        mlx-lm split it by vocabulary (its gather is a collective): only rank 0 samples, so
        computing it here would only delay this rank's next step (and rank 0's)."""
        hidden = self.adapter.hidden_states(batch, self.kv_stores, self.states)
        computed = []
        if batch.sample_rows.size and self.adapter.head_is_split:
            computed.append(self.adapter.sampled_logits(hidden, batch))
        elif batch.sample_rows.size or batch.reads_hidden:
            computed.append(hidden)
        # A step that samples no row (it only writes K/V) ends on rank 0 at the last K/V write,
        # unless rank 0 reads its hidden states (``reads_hidden``), so the last layer's
        # collectives after it are not run there, and must not be run here.
        mx.eval(*computed, *self.kv_stores.arrays(), *self._state_arrays())


def adapter_bank(model: nn.Module, config: EngineConfig, ranks: Ranks | None) -> AdapterBank | None:
    """The adapters of ``config.adapters`` installed in ``model``, more added while it serves
    (None: a launched group, which serves none)."""
    if ranks is None:
        return AdapterBank(model, config.adapters)
    if config.adapters:
        raise ValueError("adapters are served by one process (not a launched group yet)")
    return None


def model_vocab_size(model: nn.Module) -> int:
    """``args.vocab_size`` (mlx-vlm's language models: ``config.vocab_size``), else the rows of
    the model's token embedding (Phixtral's ``transformer.embd.wte``, Gemma 3n's
    ``embed_tokens`` inside its wrapper)."""
    args = getattr(model, "args", None) or getattr(model, "config", None)
    size = getattr(args, "vocab_size", None)
    if size:
        return int(size)
    for name, module in model.named_modules():
        named = name.rsplit(".", 1)[-1] in _EMBEDDING_NAMES
        if named and isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
            return int(getattr(module, "num_embeddings", 0) or module.weight.shape[0])
    raise ValueError("cannot tell the model's vocabulary size (no args.vocab_size)")


_EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings", "embeddings", "embedding")


def cache_specs(
    adapter: ModelAdapter, fmt: PageFormat, block_size: int
) -> tuple[FullAttentionSpec, SlidingWindowSpec | None, RecurrentStateSpec | None]:
    """What the model's layers need of each cache group: the full-attention layers' pages (an
    MLA model's latent rows: ``LatentSpec``; a sparse one's with its indexer's keys:
    ``IndexerKeysSpec``), the sliding-window layers' (None: no window group), the recurrent
    layers' states (None: not a hybrid model)."""
    full_shapes, window_shapes = adapter.group_shapes
    # (a recurrent-only model's full group holds no pages: its blocks only count positions)
    latent = bool(full_shapes) and all(s.value_dim is not None for s in full_shapes)
    per_block = fmt.bytes_per_block(full_shapes, block_size)
    full: FullAttentionSpec
    if adapter.sparse:
        index_shapes = [s for s in full_shapes if s.value_dim == 0]
        full = IndexerKeysSpec(per_block, fmt.bytes_per_block(index_shapes, block_size))
    else:
        full = (LatentSpec if latent else FullAttentionSpec)(per_block)
    window = None
    if adapter.window is not None:
        window = SlidingWindowSpec(fmt.bytes_per_block(window_shapes, block_size), adapter.window)
    states = None
    if adapter.state_shapes:
        spec = HeldStateSpec if adapter.holds_caches else RecurrentStateSpec
        states = spec(sum(s.nbytes for s in adapter.state_shapes))
    return full, window, states


def window_pool_cap(
    model: nn.Module,
    per_block: int,
    window_per_block: int,
    runner: ModelRunner,
    config: EngineConfig,
) -> int:
    """The window group's cap: what ``max_num_seqs`` requests can hold at once (each its window
    before the last block boundary and a step's chunk, in blocks), no more than the memory
    budget holds with a full-group block beside each. The window group never needs more blocks
    than the full group holds (a request's window entries are a subset of its positions, and a
    shared window block is shared in the full group too), so the engine also caps it at the
    full group's cap; it is never what preempts a request."""
    window = runner.adapter.window
    assert window is not None
    size = config.block_size
    per_request = ceil_div(window + config.max_num_batched_tokens, size) + 2
    per_request = min(per_request, ceil_div(runner.context_length, size))
    fits = config.num_blocks or blocks_for_memory(
        model, per_block + window_per_block, runner.context_length, config
    )
    return min(config.max_num_seqs * per_request, fits)


def verifies_drafts(config: EngineConfig) -> bool:
    """Whether steps may verify drafts, so each request's recurrent state slot has a rollback
    snapshot beside it (``StateStore``)."""
    return config.speculative != "off"


def blocks_for_memory(
    model: nn.Module, per_block: int, context_length: int, config: EngineConfig, reserved: int = 0
) -> int:
    """The pool's cap: blocks of ``per_block`` bytes (their true size, scales included) that fit
    in ``memory_fraction`` of what is left after the weights (and ``reserved`` bytes: the window
    group's cap and a hybrid's request state slots at their most), capped at what
    ``max_num_seqs`` sequences of ``context_length`` tokens can use."""
    info = mx.device_info() if mx.default_device() == mx.gpu else {}
    # On a Mac the GPU may use the recommended working set of unified memory; on CPU, all RAM.
    total = int(
        info.get("max_recommended_working_set_size")
        or info.get("memory_size")
        or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    )
    weights = sum(array.nbytes for array in parameter_arrays(model))
    budget = max(0, int(total * config.memory_fraction) - weights - reserved)
    most_useful = config.max_num_seqs * ceil_div(context_length, config.block_size)
    blocks = min(budget // per_block, most_useful) if per_block else most_useful
    if blocks < 1:
        raise ValueError(
            f"no memory left for the KV cache: weights take {weights / 2**30:.1f} GiB of "
            f"{total / 2**30:.1f} GiB; raise memory_fraction or set num_blocks"
        )
    return int(blocks)
