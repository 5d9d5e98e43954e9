"""The engine core: requests in, one packed forward per step, outputs out.

Three parts, as in vLLM v1: the ``InputProcessor`` (processor.py) turns prompts into requests on
any thread; the core here owns the scheduler, the KV manager and the step loop; the
``ModelRunner`` (model_runner.py) owns the model, the KV pages, the forward and sampling.

Steps are pipelined: ``step()`` dispatches step N+1 to the device (``mx.async_eval``) and only
then reads step N's sampled tokens and turns them into outputs (detokenizing, matching stop
strings), so that host work overlaps the device's. Requests whose next sampling needs their
previous token on the host (penalties, constraints) have it read between step N+1's forward and
its sampling; rank 0 of a distributed group steps synchronously. See docs/engine.md, "The
pipelined step".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine import host_memory
from macbatch.engine.assembly import engine_info_of, kv_manager_for, model_info_of
from macbatch.engine.config import EngineConfig
from macbatch.engine.constraints import ConstraintCompiler
from macbatch.engine.model_runner import ModelRunner
from macbatch.engine.packing import PackedBatch, pack
from macbatch.engine.processor import InputProcessor, PromptEncoder, prompt_input
from macbatch.engine.prompt import Prompt, PromptInput
from macbatch.engine.request import FinishReason, Request, RequestOutput
from macbatch.engine.sampling import SampledBatch, SamplingParams
from macbatch.engine.scheduler import Scheduler, StepPlan
from macbatch.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


@dataclass
class EngineStats:
    running: int
    waiting: int
    preemptions: int
    kv_blocks_used: int  # taken by requests
    kv_blocks_total: int  # the pool's blocks now (an elastic pool grows to kv_blocks_cap)
    kv_blocks_cap: int
    tokens_last_step: int
    steps: int
    prompt_tokens: int
    generated_tokens: int
    prefix_cache_hit_rate: float
    cached_blocks: int
    kv_cache_bytes: int  # the whole pool now, scales included
    # Pages held by requests and the prefix cache, and a hybrid model's recurrent states in use
    # (running requests' slots and the prefix cache's checkpoints).
    kv_bytes_used: int
    # Seconds the engine thread spent in MLX's evaluation calls (dispatching a step, reading its
    # results): blocked on the device, bar the dispatch's own bookkeeping. Benchmarks read it to
    # split host from device time.
    device_wait_s: float = 0.0

    @property
    def kv_usage(self) -> float:
        """Blocks taken by requests, of the most the pool may hold."""
        return self.kv_blocks_used / self.kv_blocks_cap if self.kv_blocks_cap else 0.0


class Engine(PromptEncoder):
    """Continuous batching over a paged KV cache for one mlx-lm model.

    Not thread-safe: use it from one thread, or through ``EngineThread`` (its ``processor`` is
    the exception: any thread may prepare requests with it).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer | TokenizerWrapper,
        config: EngineConfig | None = None,
        model_name: str = "model",
        owns_model: bool = False,
        group: mx.distributed.Group | None = None,
    ) -> None:
        """``owns_model``: the engine loaded ``model`` itself and may cast it for the backend (a
        caller's model is cast only when ``config.dtype`` asks). ``group``: the ranks that share
        this model (tensor parallel); every rank builds its runner at the same point, and only
        rank 0 builds an Engine (docs/distributed.md)."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        self.config = config = config or EngineConfig()
        self.model_name = model_name
        self.runner = runner = ModelRunner(model, config, owns_model, group)
        self.adapter, self.store = runner.adapter, runner.store
        self.compute_dtype = runner.compute_dtype  # what the weights run in, and why
        self.tokenizer: TokenizerWrapper = (
            tokenizer if isinstance(tokenizer, TokenizerWrapper) else TokenizerWrapper(tokenizer)
        )
        model_info = model_info_of(model_name, runner, self.tokenizer)
        self.info = engine_info_of(model_info, config, runner.pool_size.cap)
        self.tool_format = model_info.tool_format  # the template's tool calls (parse, grammar)
        eos = sorted(self.tokenizer.eos_token_ids or ())
        self.constraints = ConstraintCompiler(self.tokenizer._tokenizer, runner.vocab_size, eos)
        runner.constraints = self.constraints
        self.processor = InputProcessor(self.tokenizer, self.info, self.constraints)
        self.pool, self.window_pool, self.kv = kv_manager_for(runner, config, model_name)
        self.scheduler = Scheduler(self.kv, config.max_num_batched_tokens, config.max_num_seqs)
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []
        self._in_flight: _InFlightStep | None = None
        self._steps = 0
        self._tokens_last_step = 0
        self._prompt_tokens = 0
        self._cached_prompt_tokens = 0
        self._generated_tokens = 0
        self._device_wait_s = 0.0
        # Rank 0 of a group steps synchronously: a step's broadcast carries its input tokens
        # from the host, and its collectives must finish before the next step's broadcast.
        self._pipelined = config.pipelined and group is None

    def _processor(self) -> InputProcessor:
        return self.processor

    @classmethod
    def load(cls, name: str, config: EngineConfig | None = None) -> Engine:
        """Load ``name``: "demo", a local model directory, or a Hugging Face hub id (on every
        rank of a launched group: docs/distributed.md)."""
        from macbatch.engine.distributed.loading import load

        config = config or EngineConfig()
        model, tokenizer, group = load(name, config)
        return cls(model, tokenizer, config, model_name=name, owns_model=True, group=group)

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt: Prompt | PromptInput,
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
        prompt: Prompt | PromptInput,
        params: SamplingParams,
        request_id: str | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Request:
        """Validate and tokenize (``InputProcessor.process``: safe off the engine thread)."""
        prompt = prompt_input(prompt, chat_template_kwargs, tools)
        return self.processor.process(prompt, params, request_id)

    def enqueue(self, request: Request) -> None:
        """Queue a prepared request (the processor already fitted it to the context);
        ``ValueError`` if its id is in use."""
        if request.request_id in self._requests:
            raise ValueError(f"request id '{request.request_id}' is already in use")
        self._requests[request.request_id] = request
        self.scheduler.add(request)

    def context_limit(self) -> tuple[int, str]:
        """The most tokens one sequence may hold (prompt and reply), and what sets that limit.

        The one rule every front end uses: ``max_tokens`` is a cap that shrinks to the room the
        prompt leaves under this limit (``RequestOutput.capped_max_tokens`` says when it did).
        """
        return self.info.context_limit, self.info.context_limit_reason

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
        self.runner.close()

    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._pending) or self._in_flight is not None

    def shrink_pool(self) -> int:
        """Give an elastic pool's memory back: down to its start size, keeping the prefix cache
        that fits. Only while nothing is unfinished (``EngineThread`` calls it when the engine
        has been idle for ``config.kv_shrink_after_s``); returns the blocks given back."""
        if self.has_unfinished():
            return 0
        given_back = self.kv.shrink()
        host_memory.release()  # and the heap's free step buffers (engine/host_memory.py)
        return given_back

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
        logits = self.runner.forward(self._pack(plan, previous))
        sampled = [c.request for c in plan.chunks if c.samples]  # the rows of ``logits``
        read: list[RequestOutput] = []
        if read_first is not None:
            if logits is not None:
                mx.async_eval(logits)
            read = self._postprocess(read_first)
        result = None if logits is None else self.runner.sample(logits, sampled)
        self._device_wait_s += self.runner.launch(result)
        self._steps += 1
        self._advance(plan, sampled)
        return _InFlightStep(sampled, result, self._steps), read

    def _pack(self, plan: StepPlan, previous: _InFlightStep | None) -> PackedBatch:
        tables = [self.kv.block_table(c.request.request_id) for c in plan.chunks]
        states = None
        if self.runner.states is not None:
            states = [
                self.kv.state_chunk(c.request.request_id, c.start, c.num_tokens)
                for c in plan.chunks
            ]
        window = None
        if self.kv.window is not None:
            window_tables = [self.kv.window_table(c.request.request_id) for c in plan.chunks]
            window = (window_tables, self.runner.window_head_counts)
        batch = pack(
            plan, tables, self.config.block_size, self.runner.kv_head_counts, states, window
        )
        if batch.pending_rows:
            assert previous is not None, "a pending token without a step in flight"
            _feed_sampled_tokens(batch, plan, previous)
        return batch

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
        prompts: Sequence[Prompt | PromptInput],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; final outputs in the order given
        (``chat_template_kwargs`` apply to every chat prompt given without a ``PromptInput``)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        requests = [
            self.processor.process(
                p if isinstance(p, PromptInput) else PromptInput(p, chat_template_kwargs), sp
            )
            for p, sp in zip(prompts, params)
        ]
        for request in requests:
            self.enqueue(request)
        ids = [r.request_id for r in requests]
        wanted = set(ids)
        finals: dict[str, RequestOutput] = {}
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
            kv_blocks_cap=self.info.kv_blocks_cap,
            tokens_last_step=self._tokens_last_step,
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
            prefix_cache_hit_rate=(
                self._cached_prompt_tokens / self._prompt_tokens if self._prompt_tokens else 0.0
            ),
            cached_blocks=self.pool.num_cached,
            kv_cache_bytes=self.runner.kv_stores.nbytes,
            kv_bytes_used=self._kv_bytes_used(),
            device_wait_s=self._device_wait_s,
        )

    def _kv_bytes_used(self) -> int:
        used = self.pool.num_occupied * self.runner.store.bytes_per_block
        window = self.runner.window_store
        if self.window_pool is not None and window is not None:
            used += self.window_pool.num_occupied * window.bytes_per_block
        states = self.runner.states
        if states is not None:
            checkpoints = self.kv.checkpoints
            in_use = self.kv.state_slots_in_use + (len(checkpoints) if checkpoints else 0)
            used += in_use * states.bytes_per_slot
        return used


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
