"""The engine core: requests in, one packed forward per step, outputs out.

Steps are pipelined: ``step()`` dispatches step N+1 to the device (``mx.async_eval``) and only
then reads step N's sampled tokens and turns them into outputs (detokenizing, matching stop
strings), so that host work overlaps the device's. Requests whose next sampling needs their
previous token on the host (penalties, constraints) have it read between step N+1's forward and
its sampling; rank 0 of a distributed group steps synchronously. See docs/engine.md, "The
pipelined step".
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

import macbatch.metal
from macbatch.engine import chat_template
from macbatch.engine.adapter import ModelAdapter
from macbatch.engine.compute_dtype import settle_compute_dtype
from macbatch.engine.config import EngineConfig
from macbatch.engine.constraints import ConstraintCompiler, ConstraintState
from macbatch.engine.distributed.channel import channel_of
from macbatch.engine.distributed.group import current as distributed_group
from macbatch.engine.distributed.group import smallest
from macbatch.engine.distributed.loading import load_on_every_rank
from macbatch.engine.distributed.sharding import shard_model
from macbatch.engine.kv_cache import BlockPool, KVStore, PageFormat
from macbatch.engine.kv_manager import KVManager
from macbatch.engine.packing import PackedBatch, pack
from macbatch.engine.reasoning import ReasoningFormat, ReasoningTracker
from macbatch.engine.request import (
    FinishReason,
    PromptTooLongError,
    Request,
    RequestMetrics,
    RequestOutput,
)
from macbatch.engine.sampling import SampledBatch, SamplingParams, sample
from macbatch.engine.scheduler import Scheduler, StepPlan
from macbatch.engine.tool_calls import check_tools, detect_tool_format, template_messages

Prompt = Sequence[int] | str | Sequence[dict[str, Any]]


@dataclass
class EngineStats:
    running: int
    waiting: int
    preemptions: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_last_step: int
    steps: int
    prompt_tokens: int
    generated_tokens: int
    prefix_cache_hit_rate: float
    cached_blocks: int
    kv_cache_bytes: int  # the whole pool, scales included
    # Seconds the engine thread spent in MLX's evaluation calls (dispatching a step, reading its
    # results): blocked on the device, bar the dispatch's own bookkeeping. Benchmarks read it to
    # split host from device time.
    device_wait_s: float = 0.0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class Engine:
    """Continuous batching over a paged KV cache for one mlx-lm model.

    Not thread-safe: use it from one thread, or through ``EngineThread``.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: EngineConfig | None = None,
        model_name: str = "model",
        owns_model: bool = False,
        group: mx.distributed.Group | None = None,
    ) -> None:
        """``owns_model``: the engine loaded ``model`` itself and may cast it for the backend (a
        caller's model is cast only when ``config.dtype`` asks). ``group``: the ranks that share
        this model (tensor parallel); every rank builds its Engine at the same point, and only
        rank 0's is stepped (docs/distributed.md)."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        self.config = config or EngineConfig()
        self.model_name = model_name
        self.compute_dtype = settle_compute_dtype(model, self.config.dtype, owns_model)
        if group is not None:
            shard_model(model, group)
        self.adapter = ModelAdapter(model)
        model = self.adapter.model  # the text model (a multimodal wrapper's language_model)
        macbatch.metal.ensure_selftest()  # on Metal: prove the kernel before serving with it
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, TokenizerWrapper) else TokenizerWrapper(tokenizer)
        )
        self.vocab_size = _vocab_size(model)
        self.reasoning_format = ReasoningFormat.of(self.tokenizer)
        self.tool_format = detect_tool_format(self.tokenizer)
        self.constraints = ConstraintCompiler(
            self.tokenizer._tokenizer, self.vocab_size, sorted(self.tokenizer.eos_token_ids or ())
        )
        block_size = self.config.block_size
        shapes = self.adapter.layer_shapes
        fmt = PageFormat(self.adapter.kv_dtype, self.config.kv_bits, self.config.kv_group_size)
        per_block = fmt.bytes_per_block(shapes, block_size)  # also: a bad group size fails here
        num_blocks = self.config.num_blocks or _blocks_for_memory(
            model, per_block, block_size, self.config
        )
        if group is not None:  # block ids mean the same on every rank: the smallest pool wins
            num_blocks = smallest(num_blocks, group)
        self.store = KVStore(shapes, num_blocks, block_size, fmt)
        self.pool = BlockPool(num_blocks)
        prefix_root = (
            f"{model_name}:{self.adapter.model_type}".encode()
            if self.config.enable_prefix_caching
            else None
        )
        self.kv = KVManager(self.pool, block_size, prefix_root)
        self.scheduler = Scheduler(
            self.kv, self.config.max_num_batched_tokens, self.config.max_num_seqs
        )
        model_len = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        self.max_model_len = self.config.max_model_len or model_len or num_blocks * block_size
        self._kv_head_counts = {s.num_kv_heads for s in shapes}
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []
        self._in_flight: _InFlightStep | None = None
        self._rng = random.Random()
        self._steps = 0
        self._tokens_last_step = 0
        self._prompt_tokens = 0
        self._cached_prompt_tokens = 0
        self._generated_tokens = 0
        self._device_wait_s = 0.0
        self._followers = channel_of(group) if group is not None and group.rank() == 0 else None
        # Rank 0 of a group steps synchronously: a step's broadcast carries its input tokens
        # from the host, and its collectives must finish before the next step's broadcast.
        self._pipelined = self.config.pipelined and group is None

    @classmethod
    def load(cls, name: str, config: EngineConfig | None = None) -> Engine:
        """Load ``name``: "demo", a local model directory, or a Hugging Face hub id."""
        from macbatch.engine.loader import declared_head_dim, load_model

        config = config or EngineConfig()
        head_dim = declared_head_dim(name) if config.kv_bits else None
        if head_dim is not None:  # a group size that cannot work fails before the weights load
            PageFormat(mx.float16, config.kv_bits, config.kv_group_size).group_size_for(head_dim)
        group = distributed_group()
        if group is None:
            model, tokenizer = load_model(name)
        else:
            model, tokenizer = load_on_every_rank(name, config, group)
        return cls(model, tokenizer, config, model_name=name, owns_model=True, group=group)

    # -- requests --------------------------------------------------------------------------

    def encode_prompt(
        self,
        prompt: Prompt,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids for a prompt: ids as given, raw text encoded (one BOS, as mlx-lm), chat
        messages templated with ``chat_template_kwargs`` as template variables and ``tools``
        (OpenAI-shaped function tools) rendered by the template."""
        if tools is not None and not _is_chat(prompt):
            raise ValueError("tools need a chat prompt (a list of messages)")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            ids = chat_template.encode_text(self.tokenizer, prompt)
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = self._apply_chat_template(prompt, chat_template_kwargs, tools)
        elif isinstance(prompt, Sequence) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
                )
        else:
            raise ValueError(
                "prompt must be a list of token ids, a string, or a list of chat messages "
                "({'role': ..., 'content': ...})"
            )
        if not ids:
            raise ValueError("prompt is empty")
        return ids

    def _apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        chat_template_kwargs: dict[str, Any] | None,
        tools: list[dict[str, Any]] | None,
    ) -> list[int]:
        chat_template.check_content_parts(messages)
        messages = template_messages(messages)  # tool calls and results in the history
        if not chat_template.has_chat_template(self.tokenizer):
            raise ValueError(
                f"model '{self.model_name}' has no chat template; send a text prompt instead"
            )
        variables = chat_template.check_chat_template_kwargs(chat_template_kwargs)
        if tools is not None:
            variables["tools"] = check_tools(tools)
        return chat_template.encode_chat(self.tokenizer, messages, variables)

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Queue a request; ``ValueError`` on bad input (nothing is queued then)."""
        request = self.prepare_request(
            prompt, params or SamplingParams(), request_id, chat_template_kwargs, tools
        )
        self.enqueue(request)
        return request.request_id

    def prepare_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Request:
        """Validate and tokenize (safe off the engine thread: no MLX work happens here)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = self.encode_prompt(prompt, chat_template_kwargs, tools)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
            raise ValueError(f"request id '{request_id}' is already in use")
        limit, what = self.context_limit()
        room = limit - len(ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt ({len(ids)} tokens) leaves no room for a reply in {what} ({limit} tokens)"
            )
        capped = params.max_tokens is not None and params.max_tokens > room
        if params.max_tokens is None or capped:
            params = replace(params, max_tokens=room)
        fmt = self.reasoning_format
        reasoning = (
            ReasoningTracker(fmt, fmt.initial_phase(ids))
            if fmt is not None and _is_chat(prompt)
            else None
        )
        spec = params.structured
        constraint = (
            ConstraintState(self.constraints.compile(spec), reasoning, spec.own_channel)
            if spec is not None
            else None
        )
        return Request(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else self._rng.getrandbits(62),
            eos_token_ids=frozenset(self.tokenizer.eos_token_ids or ()),
            detokenizer=self.tokenizer.detokenizer,
            metrics=RequestMetrics(arrival_time=time.monotonic(), prompt_tokens=len(ids)),
            capped_max_tokens=room if capped else None,
            reasoning=reasoning,
            constraint=constraint,
        )

    def enqueue(self, request: Request) -> None:
        """Queue a prepared request (``prepare_request`` already fitted it to the context)."""
        self._requests[request.request_id] = request
        self.scheduler.add(request)

    def context_limit(self) -> tuple[int, str]:
        """The most tokens one sequence may hold (prompt and reply), and what sets that limit.

        The one rule every front end uses: ``max_tokens`` is a cap that shrinks to the room the
        prompt leaves under this limit (``RequestOutput.capped_max_tokens`` says when it did).
        """
        capacity = self.pool.num_blocks * self.config.block_size
        if self.max_model_len <= capacity:
            return self.max_model_len, "the model's context length"
        return capacity, "the whole KV cache pool"

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; its final output comes with the next step."""
        request = self._requests.get(request_id)
        if request is not None and not request.finished:
            self._finish(request, FinishReason.ABORT)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        self.scheduler.finish(request)
        request.finish(reason, time.monotonic(), error)
        self._pending.append(request.make_output(self._steps))
        del self._requests[request.request_id]

    def close(self) -> None:
        """Let the other ranks of a distributed engine exit; this engine must not step again."""
        if self._followers is not None:
            self._followers.send_stop()

    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._pending) or self._in_flight is not None

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Dispatch one packed forward over everything scheduled; return the outputs of the step
        before it, read while this one runs (or of this one, when not ``config.pipelined``)."""
        outputs, self._pending = self._pending, []
        previous, self._in_flight = self._in_flight, None
        # A request whose sampling needs its previous token on the host (a grammar mask, or
        # penalties) gets it read after this step's forward is dispatched and before its
        # sampling graph is built: the forward still overlaps the read and the mask fill.
        read_first = previous if previous is not None and self._needs_host_tokens() else None
        plan = self.scheduler.schedule()
        self._tokens_last_step = plan.num_tokens
        current = None
        if plan.chunks:
            current, read = self._dispatch(plan, previous, read_first)
            outputs += read
            if read_first is not None:
                previous = None  # read inside the dispatch
        if previous is not None:
            outputs += self._postprocess(previous)
        if current is not None and not self._pipelined:
            outputs += self._postprocess(current)
        else:
            self._in_flight = current
        return outputs

    def _needs_host_tokens(self) -> bool:
        """Whether a running request must see its pending token on the host before its next
        step's graph is built (``Request.needs_host_token``)."""
        return any(r.num_pending and r.needs_host_token for r in self.scheduler.running)

    def _dispatch(
        self, plan: StepPlan, previous: _InFlightStep | None, read_first: _InFlightStep | None
    ) -> tuple[_InFlightStep, list[RequestOutput]]:
        """Pack, forward, sample, and start it all on the device; returns the step and the
        outputs of ``read_first`` (the step in flight, read after the forward starts and before
        the sampling graph is built on its tokens). Nothing else waits here."""
        self._note_first_schedule(plan)
        batch = self._pack(plan, previous)
        if self._followers is not None:  # the other ranks run this same forward on their shard
            self._followers.send_step(batch)
        logits = self.adapter.forward(batch, self.store)
        sampled = [c.request for c in plan.chunks if c.samples]  # the rows of ``logits``
        read: list[RequestOutput] = []
        if read_first is not None:
            if logits is not None:
                mx.async_eval(logits)
            read = self._postprocess(read_first)
        result = None
        if logits is not None:
            # A request that finished on the token just read samples a token nobody emits.
            constraints = [None if r.finished else r.constraint for r in sampled]
            logits = self.constraints.mask_logits(
                logits, constraints, [r.num_generated for r in sampled]
            )
            result = sample(logits, sampled)
        self._launch(result)
        self._advance(plan, sampled)
        return _InFlightStep(sampled, result, self._steps), read

    def _pack(self, plan: StepPlan, previous: _InFlightStep | None) -> PackedBatch:
        tables = [self.kv.block_table(c.request.request_id) for c in plan.chunks]
        batch = pack(plan, tables, self.config.block_size, self._kv_head_counts)
        if batch.pending_rows:
            assert previous is not None, "a pending token without a step in flight"
            _feed_sampled_tokens(batch, plan, previous)
        return batch

    def _launch(self, result: SampledBatch | None) -> None:
        """``mx.async_eval`` the step: its samples and the KV pages it writes."""
        # Timed as device wait too: with many ops outstanding MLX blocks here (on the CPU
        # backend, until the step in flight is nearly done).
        started = time.perf_counter()
        arrays = [*(result.arrays() if result else []), *self.store.arrays()]
        if self._followers is None:
            mx.async_eval(*arrays)
        else:  # every collective of the step done before the next broadcast (docs/distributed.md)
            mx.eval(*arrays)
            self._followers.step_finished()
        self._device_wait_s += time.perf_counter() - started
        self._steps += 1

    def _advance(self, plan: StepPlan, sampled: list[Request]) -> None:
        """Book the dispatched step: computed tokens, prefix-cache names of full blocks whose
        tokens are known (later readers run after this step on the same stream), and one
        pending token per sampled request."""
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed_tokens += chunk.num_tokens
            self.kv.cache_full_blocks(
                request, min(request.num_computed_tokens, request.num_known_tokens)
            )
        for request in sampled:
            request.num_pending += 1

    def _note_first_schedule(self, plan: StepPlan) -> None:
        now = time.monotonic()
        for chunk in plan.chunks:
            metrics = chunk.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.cached_tokens = chunk.start
                self._prompt_tokens += chunk.request.num_tokens
                self._cached_prompt_tokens += chunk.start

    def _postprocess(self, done: _InFlightStep) -> list[RequestOutput]:
        """Read a dispatched step's tokens; append them, check stops, detokenize, make outputs.
        A request that stopped or was aborted since the step was dispatched drops its token."""
        if done.sampled is None:
            return []
        waited = time.perf_counter()
        results = done.sampled.to_host()
        self._device_wait_s += time.perf_counter() - waited
        now = time.monotonic()
        outputs = []
        for i, request in enumerate(done.requests):
            request.num_pending -= 1
            if request.finished:
                continue
            token, logprob, top = results.row(i, request.params.logprobs)
            self._generated_tokens += request.append_token(token, now, logprob, top)
            if request.finished:
                self.scheduler.finish(request)
                del self._requests[request.request_id]
            outputs.append(request.make_output(done.step))
        return outputs

    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; final outputs in the order given
        (``chat_template_kwargs`` apply to every chat prompt)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        requests = [
            self.prepare_request(p, sp, None, chat_template_kwargs)
            for p, sp in zip(prompts, params)
        ]
        finals: dict[str, RequestOutput] = {}
        for request in requests:
            self.enqueue(request)
        ids = [r.request_id for r in requests]
        wanted = set(ids)
        while len(finals) < len(ids):
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    finals[out.request_id] = out
        return [finals[i] for i in ids]

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            preemptions=self.scheduler.num_preemptions,
            kv_blocks_used=self.pool.num_blocks - self.pool.num_free,
            kv_blocks_total=self.pool.num_blocks,
            tokens_last_step=self._tokens_last_step,
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
            prefix_cache_hit_rate=(
                self._cached_prompt_tokens / self._prompt_tokens if self._prompt_tokens else 0.0
            ),
            cached_blocks=self.pool.num_cached,
            kv_cache_bytes=self.store.nbytes,
            device_wait_s=self._device_wait_s,
        )


@dataclass
class _InFlightStep:
    """A dispatched step whose sampled tokens the host has not read yet."""

    requests: list[Request]  # in sample-row order
    sampled: SampledBatch | None
    step: int

    def row_of(self) -> dict[str, int]:
        return {r.request_id: i for i, r in enumerate(self.requests)}


def _feed_sampled_tokens(batch: PackedBatch, plan: StepPlan, previous: _InFlightStep) -> None:
    """Fill the pending rows' input tokens from the previous step's samples, on the device. A
    decode-only step over exactly the requests the previous step sampled, in its order (steady
    decoding), takes those samples as its input as they are: no gather, no scatter."""
    assert previous.sampled is not None
    every_row_pending = len(batch.pending_rows) == batch.num_tokens
    if every_row_pending and [c.request for c in plan.chunks] == previous.requests:
        batch.token_ids = previous.sampled.tokens
        return
    row_of = previous.row_of()
    sources = [row_of[plan.chunks[i].request.request_id] for i in batch.pending_chunks]
    tokens = previous.sampled.tokens[mx.array(sources)].astype(mx.int32)
    batch.token_ids[mx.array(batch.pending_rows)] = tokens


def _is_chat(prompt: Prompt) -> bool:
    return not isinstance(prompt, str) and bool(prompt) and isinstance(prompt[0], dict)


def _vocab_size(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    if size:
        return int(size)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None:
        return int(embed.weight.shape[0])
    raise ValueError("cannot tell the model's vocabulary size (no args.vocab_size)")


def _blocks_for_memory(
    model: nn.Module, per_block: int, block_size: int, config: EngineConfig
) -> int:
    """Blocks of ``per_block`` bytes (their true size, scales included) that fit in
    ``memory_fraction`` of what is left after the weights."""
    from mlx.utils import tree_flatten

    info = mx.device_info() if mx.default_device() == mx.gpu else {}
    # On a Mac the GPU may use the recommended working set of unified memory; on CPU, all RAM.
    total = int(
        info.get("max_recommended_working_set_size")
        or info.get("memory_size")
        or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    )
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    budget = max(0, int(total * config.memory_fraction) - weights)
    blocks = budget // per_block
    model_len = (
        config.max_model_len
        or getattr(getattr(model, "args", None), "max_position_embeddings", None)
        or 32768
    )
    most_useful = config.max_num_seqs * (-(-model_len // block_size))
    blocks = min(blocks, most_useful)
    if blocks < 1:
        raise ValueError(
            f"no memory left for the KV cache: weights take {weights / 2**30:.1f} GiB of "
            f"{total / 2**30:.1f} GiB; raise memory_fraction or set num_blocks"
        )
    return int(blocks)
