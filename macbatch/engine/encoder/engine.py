"""An encoder checkpoint's engine: its pooling requests packed into one varlen bidirectional
pass per step (the step's sequences over ``cu_seqlens``, ``varlen.py``; no KV kept after it),
driven by ``EngineThread`` and ``run``'s loop as the paged engine is.

An encoder's rows cannot share a decoder's forward (other weights, attention both ways), so an
encoder runs in an engine of its own, beside the generation engines of serve's other models
(their steps take turns of the device, ``engine/device.py``); every encoder request of a step
goes into its one pass. A step picks its pass among the waiting requests of a window of
``WINDOW_PASSES`` passes' tokens, sorted by length (``packing.py``), always holding the oldest
request, so passes stay full, lengths within a pass close, and no request waits forever."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

from macbatch.engine.config import EngineConfig
from macbatch.engine.core.outputs import FinishReason, RequestOutput
from macbatch.engine.core.request import Request
from macbatch.engine.core.stats import EngineStats
from macbatch.engine.encoder.facts import EncoderFacts
from macbatch.engine.encoder.model import EncoderInput, EncoderModel, pooled, shaped
from macbatch.engine.encoder.packing import passes
from macbatch.engine.encoder.requests import EncoderProcessor, EncoderTokenizer
from macbatch.engine.encoder.varlen import VarlenLayout
from macbatch.engine.inputs.processor import PromptEncoder, prompt_input
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.model_info import EngineInfo, ModelInfo
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams

WINDOW_PASSES = 4


class EncoderEngine(PromptEncoder):
    """Not thread-safe, as ``Engine``: one thread, or ``EngineThread`` (its ``processor`` is
    safe from any thread). ``config.max_num_batched_tokens``: the rows of one pass."""

    def __init__(self, model: EncoderModel, config: EngineConfig, name: str) -> None:
        self.model, self.config, self.model_name = model, config, name
        self.tokenizer = EncoderTokenizer(model)
        self.info = encoder_info(model, name, config)
        self.processor = EncoderProcessor(model, self.info)
        self._waiting: dict[str, Request] = {}  # in arrival order
        self._pending: list[RequestOutput] = []  # aborted requests' final outputs
        self._steps = self._prompt_tokens = self._tokens_last_step = 0
        self._device_wait_s = 0.0

    @classmethod
    def load(cls, path: Path, name: str, config: EngineConfig | None = None) -> EncoderEngine:
        return cls(EncoderModel.load(str(path)), config or EngineConfig(), name)

    def _processor(self) -> EncoderProcessor:
        return self.processor

    # -- requests, as Engine's ---------------------------------------------------------------

    def prepare_request(
        self,
        prompt: Prompt | PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None,
    ) -> Request:
        return self.processor.process(prompt_input(prompt), params, request_id)

    def enqueue(self, request: Request) -> None:
        if request.request_id in self._waiting:
            raise ValueError(f"request id '{request.request_id}' is already in use")
        self._waiting[request.request_id] = request

    def abort(self, request_id: str) -> None:
        request = self._waiting.pop(request_id, None)
        if request is not None:
            request.finish(FinishReason.ABORT, time.monotonic())
            self._pending.append(request.make_output(self._steps))

    def has_unfinished(self) -> bool:
        return bool(self._waiting) or bool(self._pending)

    def close(self) -> None:
        """Nothing outlives a step (no pages, no disk tier)."""

    def shrink_pool(self) -> int:
        return 0  # no KV pool

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One pass over the scheduled requests; their final outputs (and aborted ones')."""
        outputs, self._pending = self._pending, []
        batch = self._schedule()
        self._tokens_last_step = sum(r.num_prompt_tokens for r in batch)
        if batch:
            outputs.extend(self._run(batch))
        self._steps += 1
        return outputs

    def _schedule(self) -> list[Request]:
        budget = self.config.max_num_batched_tokens
        window: list[Request] = []
        tokens = 0
        for request in self._waiting.values():
            if tokens >= WINDOW_PASSES * budget:
                break
            window.append(request)
            tokens += request.num_prompt_tokens
        if not window:
            return []
        chosen = next(p for p in passes([r.num_prompt_tokens for r in window], budget) if 0 in p)
        return [window[i] for i in chosen]

    def _run(self, batch: list[Request]) -> list[RequestOutput]:
        now = time.monotonic()
        for request in batch:
            del self._waiting[request.request_id]
            request.metrics.first_scheduled_time = now
        lengths = [r.num_prompt_tokens for r in batch]
        hidden, layout = self.model.hidden_states(
            [EncoderInput(tuple(r.prompt_token_ids), tuple(r.token_types or ())) for r in batch]
        )
        if self.model.config.classifier:
            results = self.model.relevance(hidden, layout, lengths)
        else:
            results = _embeddings(batch, hidden, layout, lengths)
        waited = time.perf_counter()
        values = np.array(results)  # the step's one evaluation
        self._device_wait_s += time.perf_counter() - waited
        self._prompt_tokens += sum(lengths)
        outputs = []
        starts = np.cumsum([0, *lengths])
        for i, request in enumerate(batch):
            request.finish(FinishReason.STOP, time.monotonic())
            output = request.make_output(self._steps)
            if self.model.config.classifier:
                output.score = float(values[i])
            else:
                assert request.pooling is not None
                output.embedding = values[i][: request.pooling.dimensions]
                self._m3_outputs(output, request, hidden[int(starts[i]) : int(starts[i + 1])])
            outputs.append(output)
        return outputs

    def _m3_outputs(self, output: RequestOutput, request: Request, rows: mx.array) -> None:
        """BGE-M3's sparse weights and ColBERT vectors, when the request asks for them."""
        params, heads = request.pooling, self.model.m3
        if params is None or heads is None:
            return
        if params.lexical:
            ids = tuple(request.prompt_token_ids)
            output.lexical_weights = heads.lexical_weights(rows, ids, self.model.special_ids)
        if params.colbert:
            output.colbert_vectors = heads.colbert_vectors(rows)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=0,
            waiting=len(self._waiting),
            preemptions=0,
            kv_blocks_used=0,
            kv_blocks_total=0,
            kv_blocks_cap=0,
            tokens_last_step=self._tokens_last_step,
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=0,
            prefix_cache_hit_rate=0.0,
            cached_blocks=0,
            kv_cache_bytes=0,
            kv_bytes_used=0,
            device_wait_s=self._device_wait_s,
        )


def _embeddings(
    batch: Sequence[Request], hidden: mx.array, layout: VarlenLayout, lengths: list[int]
) -> mx.array:
    """[S, hidden] float32: each request's vector as it asks (its pooling, cut to its
    dimensions and normalized; zero past them), in batch order: one pooling per method and
    one cut per kind of request, however many requests."""
    kinds = []
    for request in batch:
        params = request.pooling
        assert params is not None and params.method is not None
        kinds.append((params.method, params.dimensions, bool(params.normalize)))
    width = hidden.shape[-1]
    by_method: dict[str, mx.array] = {}
    parts, order = [], []
    for method, dimensions, normalize in dict.fromkeys(kinds):
        members = [i for i, kind in enumerate(kinds) if kind == (method, dimensions, normalize)]
        if method not in by_method:
            by_method[method] = pooled(hidden, layout, lengths, method)
        vectors = shaped(by_method[method][mx.array(members)], dimensions, normalize)
        parts.append(mx.pad(vectors, [(0, 0), (0, width - vectors.shape[-1])]))
        order.extend(members)
    return mx.concatenate(parts, axis=0)[mx.array(np.argsort(order))]


def encoder_info(model: EncoderModel, name: str, config: EngineConfig) -> EngineInfo:
    """What front ends read of an encoder (``EngineInfo``, as the paged engine's): no KV pool,
    its longest input as its context, its tasks and pooling."""
    facts = EncoderFacts(model.config, model.profile)
    info = ModelInfo(
        name=name,
        model_type=model.config.model_type,
        vocab_size=model.config.vocab_size,
        max_model_len=facts.max_tokens,
        tool_format=None,
        reasoning_format=None,
        thinking_default=None,
        kv_bytes_per_token=0,
        embedding=model.profile,
        tasks=tuple(facts.tasks),
    )
    return EngineInfo(
        model=info,
        block_size=config.block_size,
        kv_blocks_cap=0,
        context_limit=facts.max_tokens,
        context_limit_reason="the encoder's longest input (max_seq_length, else its positions)",
    )
