"""The engine core: requests in, one packed forward per step, outputs out.

Three parts, as in vLLM v1: the ``InputProcessor`` (processor.py) turns prompts into requests on
any thread; the core here owns the scheduler, the KV manager and the step loop; the
``ModelRunner`` (model_runner.py) owns the model, the KV pages, the forward and sampling.

Steps are pipelined: ``step()`` dispatches step N+1 to the device (``mx.async_eval``) and only
then reads step N's sampled tokens and turns them into outputs (detokenizing, matching stop
strings), so that host work overlaps the device's. Requests whose next sampling needs their
previous token on the host (penalties, constraints) have it read between step N+1's forward and
its sampling; rank 0 of a distributed group steps synchronously. See docs/engine.md, "The
pipelined step". With speculative decoding, a speculating decode's chunk carries its drafts and
the step reads the one before it first (docs/speculative.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.assembly import engine_info_of, kv_manager_for, model_info_of
from macbatch.engine.config import EngineConfig
from macbatch.engine.core.in_flight import InFlightStep, feed_sampled_tokens
from macbatch.engine.core.outputs import FinishReason, RequestOutput
from macbatch.engine.core.request import Request
from macbatch.engine.core.scheduler import Scheduler, StepPlan
from macbatch.engine.core.stats import EngineStats
from macbatch.engine.distributed.ranks import ranks_of
from macbatch.engine.inputs.processor import InputProcessor, PromptEncoder, prompt_input
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.lora.bank import AdapterRef
from macbatch.engine.lora.files import AdapterError
from macbatch.engine.model.adapter import UnsupportedModelError
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.participants import participants_of
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.self_check import SelfCheck, self_check
from macbatch.engine.speculative.drafters import drafter_kind, load_draft_model, speculator_for
from macbatch.engine.speculative.methods import DRAFT_MODEL_METHODS, resolved_mode
from macbatch.engine.speculative.mtp_model import mtp_head_for
from macbatch.engine.speculative.verify import DraftRow
from macbatch.engine.structured_output.constraints import ConstraintCompiler
from macbatch.engine.tokenizer import Tokenizer
from macbatch.engine.worker import host_memory
from macbatch.engine.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

log = logging.getLogger(__name__)
# A request among the requests of this many failed steps, none of which failed on one request
# alone, is failed itself: a retry that never finds the culprit must end.
MAX_FAILED_STEPS = 3


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
        draft_model: nn.Module | None = None,
        vision_from: str | None = None,
    ) -> None:
        """``owns_model``: the engine loaded ``model`` itself and may cast it for the backend (a
        caller's model is cast only when ``config.dtype`` asks). ``group``: the ranks that share
        this model (tensor parallel); every rank builds its runner at the same point, and only
        rank 0 builds an Engine (docs/distributed.md). ``draft_model``: the drafter of
        ``config.speculative == "draft"`` (a ``DFlashModel`` makes it "dflash", an
        ``Eagle3Model`` "eagle3"), or the checkpoint's MTP layer (an ``MtpHead``) for "mtp";
        "auto" drafts with whichever is given, else by prompt lookup (docs/speculative.md).
        ``vision_from``: the model name whose vision tower encodes images (``Engine.load``'s;
        None: images are refused)."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        config = config or EngineConfig()
        self.config = config = dataclasses.replace(
            config, speculative=resolved_mode(config.speculative, drafter_kind(draft_model))
        )
        self.model_name = model_name
        draft = draft_model if config.speculative in (*DRAFT_MODEL_METHODS, "mtp") else None
        self.runner = runner = ModelRunner(
            model, config, owns_model, ranks_of(group), draft, vision_from
        )
        self.compute_dtype = runner.compute_dtype  # what the weights run in, and why
        self.tokenizer: TokenizerWrapper = (
            tokenizer if isinstance(tokenizer, TokenizerWrapper) else TokenizerWrapper(tokenizer)
        )
        model_info = model_info_of(model_name, runner, self.tokenizer)
        self.info = engine_info_of(model_info, config, runner.pool_size.cap)
        eos = sorted(self.tokenizer.eos_token_ids or ())
        self.constraints = ConstraintCompiler(self.tokenizer._tokenizer, runner.vocab_size, eos)
        runner.constraints = self.constraints
        self.processor = InputProcessor(self.tokenizer, self.info, self.constraints, runner.vision)
        self.kv = kv_manager_for(runner, config, model_name)
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            runner.adapter.long_rope_after,
        )
        self.speculator = speculator_for(config, runner.draft, self.kv)
        # the step's side participants: vision rows, the drafter's observation, the disk tier
        self._participants = participants_of(runner, self.kv, self.scheduler, self.speculator)
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []  # outputs for the next ``step()`` to return
        self._touched: list[Request] = []  # the requests of the step running (``_contain``)
        self._in_flight: InFlightStep | None = None
        self.reset_counts()
        # what ``load``'s self-check found (None: not run: a model object, or switched off)
        self.self_check: SelfCheck | None = None
        # Rank 0 of a group steps synchronously: a step's broadcast carries its input tokens
        # from the host, and its collectives must finish before the next step's broadcast.
        self._pipelined = config.pipelined and group is None

    def reset_counts(self) -> None:
        """Zero what ``stats`` counts (the self-check's request is nobody's)."""
        self._steps = 0
        self._tokens_last_step = 0
        self._prompt_tokens = 0
        self._cached_prompt_tokens = 0
        self._generated_tokens = 0
        self._device_wait_s = 0.0

    def _processor(self) -> InputProcessor:
        return self.processor

    @classmethod
    def load(cls, name: str, config: EngineConfig | None = None) -> Engine:
        """Load ``name``: "demo", a local model directory, or a Hugging Face hub id (on every
        rank of a launched group: docs/distributed.md)."""
        from macbatch.engine.distributed.loading import load, settle_drafting

        config = config or EngineConfig()
        model, tokenizer, group = load(name, config)
        draft: nn.Module | None = None
        try:
            if config.speculative in DRAFT_MODEL_METHODS:
                draft = load_draft_model(config.draft_model)
            elif config.speculative in ("mtp", "auto"):
                required = config.speculative == "mtp"
                draft = mtp_head_for(name, model, required, distributed=group is not None)
                if draft is None and config.draft_model:  # auto: the named drafter next
                    draft = load_draft_model(config.draft_model)
        except Exception:
            settle_drafting(None, group)
            raise
        settle_drafting(resolved_mode(config.speculative, drafter_kind(draft)), group)
        engine = cls(
            model,
            tokenizer,
            config,
            name,
            owns_model=True,
            group=group,
            draft_model=draft,
            vision_from=name,
        )
        if config.self_check and group is None:  # a group's followers step with rank 0 only
            engine.self_check = check = self_check(engine)
            log.info("self-check of '%s': %s", name, check.describe())
            if check.problem is not None:
                engine.close()
                raise UnsupportedModelError(
                    f"model '{name}' is refused: its packed paged step does not reproduce "
                    f"{engine.runner.model_type}'s own forward in the model library: "
                    f"{check.problem} (macbatch's adapter does not run this architecture "
                    "right; --no-self-check serves it anyway)"
                )
        return engine

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt: Prompt | PromptInput,
        params: SamplingParams | PoolingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request (``PoolingParams``: a pooling request, engine/pooling/methods.py;
        template variables and tools: in a ``PromptInput``); ``ValueError`` on bad input
        (nothing is queued then)."""
        request = self.prepare_request(prompt, params or SamplingParams(), request_id)
        self.enqueue(request)
        return request.request_id

    def prepare_request(
        self,
        prompt: Prompt | PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None,
    ) -> Request:
        """Validate and tokenize (``InputProcessor.process``: safe off the engine thread)."""
        return self.processor.process(prompt_input(prompt), params, request_id)

    def enqueue(self, request: Request) -> None:
        """Queue a prepared request (the processor already fitted it to the context);
        ``ValueError`` if its id is in use."""
        if request.request_id in self._requests:
            raise ValueError(f"request id '{request.request_id}' is already in use")
        if request.pooling is not None and self.runner.group is not None:
            # a step of pooling rows alone evaluates the last layers' collectives on rank 0
            # only (followers evaluate them for sampled rows): not supported yet
            raise ValueError("embeddings and scores are not supported under mlx.launch yet")
        encoder = self.runner.vision.encoder
        if request.images is not None and encoder is not None:
            encoder.admit(request.images, self.config.max_num_batched_tokens)
        self._requests[request.request_id] = request
        self.scheduler.add(request)
        if request.reads_cached_prefix:  # its blocks on disk are read while it waits
            self.kv.prefetch(request, request.num_tokens)

    def context_limit(self) -> int:
        """The most tokens one sequence may hold (prompt and reply); what sets it, in words, is
        ``info.context_limit_reason``.

        The one rule every front end uses: ``max_tokens`` is a cap that shrinks to the room the
        prompt leaves under this limit (``RequestOutput.capped_max_tokens`` says when it did).
        """
        return self.info.context_limit

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; its final output comes with the next step."""
        request = self._requests.get(request_id)
        if request is not None and not request.finished:
            self._finish(request, FinishReason.ABORT)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        request.finish(reason, time.monotonic(), error)
        self._drop(request)
        self._pending.append(request.make_output(self._steps))

    def _drop(self, request: Request) -> None:
        """Forget a finished request: its blocks, its drafter state, its id."""
        self.scheduler.finish(request)
        self.runner.pools.drop(request.request_id)
        if self.speculator is not None:
            self.speculator.forget(request)
        del self._requests[request.request_id]

    def close(self) -> None:
        """Let the other ranks of a distributed engine exit, and the disk tier write what it
        holds; this engine must not step again."""
        for participant in self._participants:
            participant.close()
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
        if self.runner.draft is not None:  # a hybrid draft's state rows are not the pool's
            self.runner.draft.shrink()
        host_memory.release()  # and the heap's free step buffers (engine/worker/host_memory.py)
        return given_back

    def load_adapter(self, name: str, path: str) -> AdapterRef:
        """Install one more fine-tune while serving (between steps): requests may name it once
        this returns (an ``AdapterError`` says why not)."""
        if self.runner.adapters is None:
            raise AdapterError("adapters are served by one process (not a launched group yet)")
        return self.runner.adapters.add(name, path)

    def unload_adapter(self, name: str) -> bool:
        """Uninstall a fine-tune no unfinished request names (False, and nothing done, while
        one does: its slot is still read)."""
        bank = self.runner.adapters
        ref = None if bank is None else bank.refs.get(name)
        if bank is None or ref is None:
            return False
        if any(r.adapter_slot == ref.slot for r in self._requests.values()):
            return False
        bank.remove(name)
        return True

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Dispatch one packed forward over everything scheduled; return the outputs of the step
        before it, read while this one runs (or of this one, when not ``config.pipelined``). A
        step that raises fails the request behind it, not the engine (``_contain``)."""
        self._touched = []
        try:
            self._step()
        except Exception as exc:
            self._contain(exc)
        outputs, self._pending = self._pending, []
        return outputs

    def _step(self) -> None:
        """The step; its outputs go to ``_pending`` as they are made (a failure keeps them)."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            self._touched += previous.requests + [r for r, _ in previous.pooled]
        chosen = self.speculator.choose(self.scheduler.running) if self.speculator else []
        if previous is not None and (chosen or previous.drafts is not None):
            # Drafting needs every token on the host, and a verification's outcome decides
            # where its request resumes: a speculative step reads the previous one first.
            self._postprocess(previous)
            previous = None
        if chosen:
            assert self.speculator is not None
            self.speculator.propose(chosen)
        # A request whose sampling needs its previous token on the host (a grammar mask, or
        # penalties) gets it read after this step's forward is dispatched and before its
        # sampling graph is built: the forward still overlaps the read and the mask fill.
        read_first = previous if previous is not None and self._needs_host_tokens() else None
        plan = self.scheduler.schedule()
        self._touched += [c.request for c in plan.chunks]
        self._tokens_last_step = plan.num_tokens
        current = None
        if plan.chunks:
            current = self._dispatch(plan, previous, read_first)
            if read_first is not None:
                previous = None  # read inside the dispatch
        if chosen:
            assert self.speculator is not None
            self.speculator.clear(chosen)
        if previous is not None:
            self._postprocess(previous)
        if current is not None and not self._pipelined:
            self._postprocess(current)
        else:
            self._in_flight = current
        in_flight = self._in_flight is not None
        for participant in self._participants:
            participant.stepped(plan, in_flight)

    # -- a failed step -----------------------------------------------------------------------

    def _contain(self, exc: Exception) -> None:
        """A step raised: run each of its requests alone to find the one(s) it fails on, finish
        those with the error (``step_failed``: a 500 for them only) and keep serving the others.
        Re-raises (the engine is broken: ``EngineThread`` fails everything, as on any crash)
        when a one-token request fails too after a culprit was found, when no request was in
        the step, or under a distributed group (its followers stepped with it)."""
        if self.runner.group is not None:
            raise exc
        log.warning("a step failed; running its requests alone to find the one it fails on",
                    exc_info=exc)  # fmt: skip
        suspects = self._discard_step()
        if not suspects:
            raise exc
        culprits = [(r, error) for r in suspects if (error := self._trial(r)) is not None]
        if culprits and not self._engine_works():
            raise exc
        for request, error in culprits:
            self._fail(request, error)
        if culprits:
            return
        for request in suspects:  # failed in the step, never alone: a retry limit still holds
            request.failed_steps += 1
            if request.failed_steps >= MAX_FAILED_STEPS and not request.finished:
                self._fail(request, exc)

    def _discard_step(self) -> list[Request]:
        """After a step raised: forget the steps in flight (their unread tokens are sampled
        again) and send their requests back to recompute what they had computed. Returns
        those requests (their known tokens are kept, and the outputs already made)."""
        touched, self._touched, self._in_flight = self._touched, [], None
        suspects = list(dict.fromkeys(r for r in touched if r.request_id in self._requests))
        for request in suspects:
            request.num_pending = 0
            self.runner.pools.drop(request.request_id)
            self.scheduler.requeue(request)
        return suspects

    def _trial(self, request: Request) -> Exception | None:
        """Run ``request`` alone, one step at a time, until it samples a token (a pooling
        request: until it pools) or cannot be scheduled; the exception if a step fails."""
        tokens, pipelined, self._pipelined = len(request.output_token_ids), self._pipelined, False
        try:
            with self.scheduler.alone(request):
                while not request.finished and len(request.output_token_ids) == tokens:
                    self._touched = []
                    self._step()
                    if self._tokens_last_step == 0:
                        break  # no room now: it waits its turn like any other
        except Exception as exc:
            self._discard_step()
            return exc
        finally:
            self._pipelined = pipelined
        return None

    def _engine_works(self) -> bool:
        """Whether a one-token request still runs: tells a step that fails on one request
        from a broken engine (the canary's outputs are nobody's, and dropped here)."""
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        canary = self.processor.process(PromptInput([0]), params)
        self.enqueue(canary)
        works = self._trial(canary) is None
        self.abort(canary.request_id)  # it may have found no room to run now
        self._pending = [o for o in self._pending if o.request_id != canary.request_id]
        return works

    def _fail(self, request: Request, error: Exception) -> None:
        """Finish ``request`` with the error of the step that failed on it."""
        log.warning("request %s failed: the step fails on it (%r)", request.request_id, error)
        request.step_failed = True
        message = f"the engine failed running this request: {type(error).__name__}: {error}"
        request.finish(FinishReason.ERROR, time.monotonic(), message)  # unless it had finished
        if request.request_id in self._requests:
            self._drop(request)
        self._pending.append(request.make_output(self._steps))

    def _needs_host_tokens(self) -> bool:
        """Whether a running request must see its pending token on the host before its next
        step's graph is built (``Request.needs_host_token``)."""
        return any(r.num_pending and r.needs_host_token for r in self.scheduler.running)

    def _dispatch(
        self, plan: StepPlan, previous: InFlightStep | None, read_first: InFlightStep | None
    ) -> InFlightStep:
        """Pack, forward, sample, and start it all on the device; returns the step, having read
        ``read_first`` (the step in flight, read after the forward starts and before the
        sampling graph is built on its tokens). Nothing else waits here."""
        self._note_first_schedule(plan)
        batch = self._pack(plan, previous)
        logits, pooled = self.runner.forward(batch, plan.pool_spans())
        chunks = [c for c in plan.chunks if c.samples]
        sampled = [c.request for c in chunks]
        drafts = None  # each sampled request's drafts, when any request verifies some
        rows: Sequence[Request | DraftRow] = sampled  # the rows of ``logits``
        if any(c.num_drafts for c in chunks):
            assert self.speculator is not None
            drafts = [c.request.drafts[: c.num_drafts] for c in chunks]
            rows = [row for c in chunks for row in self.speculator.rows(c.request, c.num_drafts)]
        if read_first is not None:
            if logits is not None:
                mx.async_eval(logits)
            self._postprocess(read_first)
        result = None if logits is None else self.runner.sample(logits, rows)
        extra = list(pooled.values())
        for participant in self._participants:  # the drafter's observation, disk copies
            extra += participant.launching(plan, self._steps + 1)
        self._device_wait_s += self.runner.launch(result, extra)
        self._steps += 1
        self._advance(plan, sampled)
        done = [(self._requests[rid], vector) for rid, vector in pooled.items()]
        return InFlightStep(sampled, result, self._steps, drafts, done)

    def _pack(self, plan: StepPlan, previous: InFlightStep | None) -> PackedBatch:
        batch = self.runner.pack(plan, self.kv.step_tables(plan.chunks))
        for participant in self._participants:  # a vision model's image rows
            participant.packed(batch, plan)
        if batch.pending_rows:
            assert previous is not None, "a pending token without a step in flight"
            feed_sampled_tokens(batch, plan, previous)
        return batch

    def _advance(self, plan: StepPlan, sampled: list[Request]) -> None:
        """Book the dispatched step: computed tokens, prefix-cache names of full blocks whose
        tokens are known (later readers run after this step on the same stream), and one
        pending token per sampled request."""
        for chunk in plan.chunks:
            request = chunk.request
            # a chunk's drafts count as computed only once verified (``Speculator.verify``)
            request.num_computed_tokens += chunk.num_tokens - chunk.num_drafts
            self.kv.cache_full_blocks(
                request, min(request.num_computed_tokens, request.num_known_tokens)
            )
            if request.pooling is not None and request.num_tokens_to_compute == 0:
                # pooled: its blocks go back now (the prefix cache may keep them); the step in
                # flight writes them before any later step reads them, on the same stream
                self.scheduler.finish(request)
        for request in sampled:
            request.num_pending += 1

    def _note_first_schedule(self, plan: StepPlan) -> None:
        now = time.monotonic()
        for chunk in plan.chunks:
            metrics = chunk.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.cached_tokens = chunk.start
                metrics.disk_cached_tokens = self.kv.disk_tokens(chunk.request.request_id)
                self._prompt_tokens += chunk.request.num_tokens
                self._cached_prompt_tokens += chunk.start

    def _postprocess(self, done: InFlightStep) -> None:
        """Read a dispatched step's tokens; append them, check stops, detokenize, make outputs
        (to ``_pending``). A request that stopped or was aborted since the step was dispatched
        drops its token."""
        self._pending += self._pooled_outputs(done)
        for participant in self._participants:  # the step is done: disk copies to the writer
            participant.done(done.step)
        if done.sampled is None:
            return
        waited = time.perf_counter()
        results = done.sampled.to_host()
        self._device_wait_s += time.perf_counter() - waited
        now = time.monotonic()
        row = 0
        for i, request in enumerate(done.requests):
            drafts = done.drafts[i] if done.drafts is not None else []
            first, row = row, row + 1 + len(drafts)
            request.num_pending -= 1
            if request.finished:
                continue
            if drafts:
                assert self.speculator is not None
                self._generated_tokens += self.speculator.verify(
                    request, drafts, results, first, now, self.kv
                )
            else:
                token, logprob, top = results.row(first, request.params.logprobs)
                self._generated_tokens += request.append_token(token, now, logprob, top)
            if request.finished:
                self._drop(request)
            self._pending.append(request.make_output(done.step))

    def _pooled_outputs(self, done: InFlightStep) -> list[RequestOutput]:
        """The final outputs of the pooling requests the step finished (an aborted one has
        had its final output already)."""
        outputs = []
        for request, vector in done.pooled:
            if request.finished:
                continue
            waited = time.perf_counter()
            values = np.array(vector, dtype=np.float32)
            self._device_wait_s += time.perf_counter() - waited
            request.finish(FinishReason.STOP, time.monotonic())
            del self._requests[request.request_id]
            output = request.make_output(done.step)
            if request.pooling is not None and request.pooling.score_tokens is not None:
                output.score = float(values[0])
            else:
                output.embedding = values
            outputs.append(output)
        return outputs

    def generate(
        self,
        prompts: Sequence[Prompt | PromptInput],
        params: SamplingParams
        | PoolingParams
        | Sequence[SamplingParams | PoolingParams]
        | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; final outputs in the order given (template
        variables and tools: in a ``PromptInput``)."""
        if params is None or isinstance(params, SamplingParams | PoolingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        requests = [self.processor.process(prompt_input(p), sp) for p, sp in zip(prompts, params)]
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
            kv_blocks_used=self.kv.pool.num_blocks - self.kv.pool.num_free,
            kv_blocks_total=self.kv.pool.num_blocks,
            kv_blocks_cap=self.info.kv_blocks_cap,
            tokens_last_step=self._tokens_last_step,
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
            prefix_cache_hit_rate=(
                self._cached_prompt_tokens / self._prompt_tokens if self._prompt_tokens else 0.0
            ),
            cached_blocks=self.kv.pool.num_cached,
            kv_cache_bytes=self.runner.kv_cache_bytes(),
            kv_bytes_used=self.runner.kv_bytes_used(self.kv),
            device_wait_s=self._device_wait_s,
            disk=None if self.kv.disk is None else self.kv.disk.counts(),
            **self._speculation_stats(),
        )

    def _speculation_stats(self) -> dict[str, Any]:
        if self.speculator is None:
            return {}
        return {
            "speculation": dataclasses.replace(self.speculator.counts),  # a snapshot
            "draft_kv_bytes": self.runner.draft_bytes_used(self.kv.pool),
            "drafter": self.config.speculative,
        }
