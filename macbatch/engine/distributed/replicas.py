"""Whole-model replicas under ``mlx.launch``: every rank loads the whole model and runs its own
engine; rank 0 hands requests out and gets their final outputs back (docs/distributed.md).

Rank 0's ``ReplicatedEngine`` looks to its caller (``macbatch run``) like an ``Engine``: requests
are prepared (checked, tokenized) and queued on rank 0, handed out in small units by ``Handout``
(work stealing, grouped by prompt prefix), run by rank 0's own engine (replica 0) or sent to
another rank through the ``Exchange``, whose ``serve_replica`` loop runs them and sends back
each finished output, made self-contained (``portable``). Only finished outputs cross: the batch
runner writes whole lines. Rank 0 alone owns the files, so every line is still written once,
through the ledger, whichever replica ran it.

Faults: a rank that cannot load the model stops every rank, with its reason, before anything is
handed out (``agree_on_load``). A replica lost mid-run (its exchange raises or stops answering)
costs only the requests it held: they come back aborted, so the caller writes nothing for them and
a rerun runs them; rank 0 stops handing out (``lost``). Rank 0 lost: the others stop.
"""

from __future__ import annotations

import atexit
import json
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from macbatch.engine.config import EngineConfig
from macbatch.engine.core.outputs import FinishReason, RequestMetrics, RequestOutput
from macbatch.engine.core.request import Request
from macbatch.engine.core.stats import EngineStats
from macbatch.engine.distributed.channel import LoadOrder, channel_of
from macbatch.engine.distributed.exchange import IDLE_S, Exchange, gather_bytes
from macbatch.engine.distributed.group import current, leave
from macbatch.engine.distributed.handout import Handout
from macbatch.engine.engine import Engine
from macbatch.engine.inputs.processor import prompt_input
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.parsers.text import FixedText
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams

UNIT = 4  # requests per hand-out: small, so a slow replica never holds many that others could run
EXIT_LOST = 1

Params = SamplingParams | PoolingParams


@dataclass(frozen=True)
class Assign:
    """Rank 0 -> a replica: requests to run, as rank 0 was given them."""

    requests: list[tuple[str, PromptInput, Params]]


@dataclass(frozen=True)
class Abort:
    """Rank 0 -> a replica: stop these requests."""

    request_ids: list[str]


@dataclass(frozen=True)
class Finished:
    """A replica -> rank 0: final outputs (``portable``)."""

    outputs: list[RequestOutput]


@dataclass
class ReplicaTally:
    """What one replica did in this run, for the summary (``ReplicatedEngine.replica_stats``)."""

    rank: int
    host: str
    requests: int = 0
    generated_tokens: int = 0
    last_finished: float | None = None

    def as_dict(self, started: float) -> dict[str, Any]:
        elapsed = (self.last_finished or started) - started
        speed = self.generated_tokens / elapsed if elapsed > 0 else 0.0
        return {
            "rank": self.rank,
            "host": self.host,
            "requests": self.requests,
            "generated_tokens": self.generated_tokens,
            "tok_per_s": round(speed, 1),
        }


def replicas_problem(replicas: int) -> str | None:
    """Why this process cannot run ``replicas`` whole-model replicas (the ranks do not match),
    or None."""
    group = current()
    ranks = 1 if group is None else group.size()
    if ranks == replicas:
        return None
    launch = f"mlx.launch -n {replicas} -- macbatch run ... --replicas {replicas}"
    return (
        f"--replicas {replicas} needs {replicas} ranks, one per replica, and this run has "
        f"{ranks}: start it with `{launch}` (or a hostfile of {replicas} hosts). Replicas "
        "that are tensor-parallel groups (more ranks than replicas) are not supported: each "
        "would need a group of its own, which MLX's ring backend cannot split off. Without "
        "--replicas the ranks split one model (tensor parallelism)"
    )


def load_replicas(name: str, config: EngineConfig, replicas: int) -> Engine | ReplicatedEngine:
    """``replicas`` whole-model replicas of ``name``, one per rank of the launched group (rank 0
    only; the others run ``serve_replica``); a plain ``Engine`` for one replica alone.
    ``ValueError`` when the ranks do not match, or when a rank could not load the model."""
    if (problem := replicas_problem(replicas)) is not None:
        raise ValueError(problem)
    group = current()
    if group is None:
        return Engine.load(name, config)
    channel_of(group).send_replicate(LoadOrder(name, config))
    leave()
    engine, error = _load_alone(name, config)
    hosts = agree_on_load(name, error, group)
    assert engine is not None  # agree_on_load raised otherwise
    return ReplicatedEngine(engine, group, hosts)


def serve_replica(order: LoadOrder, group: mx.distributed.Group) -> int:
    """A rank other than 0: load the whole model, then run what rank 0 hands out until its last
    round; the exit status for the process."""
    # Ctrl-C is rank 0's to handle (finish what is in flight, then end the rounds): a replica
    # that stopped at once would lose the rows it holds.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    leave()
    engine, error = _load_alone(order.model, order.config)
    try:
        agree_on_load(order.model, error, group)
    except ValueError as exc:
        sys.stderr.write(f"macbatch rank {group.rank()}: error: {exc}\n")
        return 1
    assert engine is not None
    sys.stderr.write(f"macbatch rank {group.rank()}: a replica of {order.model}\n")
    exchange = Exchange(group)
    while not exchange.ended:
        problem = exchange.problem()
        if problem is not None:
            sys.stderr.write(f"error: {problem}\n")
            return EXIT_LOST
        refused = [r for _, message in exchange.take() for r in _obey(engine, message)]
        if engine.has_unfinished() or refused:
            finished = refused + [portable(o) for o in engine.step() if o.finished]
            if finished:
                exchange.post(0, Finished(finished))
        else:
            exchange.wait(IDLE_S)
    return 0


def _obey(engine: Engine, message: Assign | Abort) -> list[RequestOutput]:
    """Queue or abort what rank 0 says; the final outputs of requests this engine refused."""
    if isinstance(message, Abort):
        for request_id in message.request_ids:
            engine.abort(request_id)
        return []
    refused = []
    for request_id, prompt, params in message.requests:
        try:
            engine.enqueue(engine.prepare_request(prompt, params, request_id))
        except Exception as exc:  # rank 0 checked it with the same model: not expected
            refused.append(ended(request_id, FinishReason.ERROR, str(exc)))
    return refused


def _load_alone(name: str, config: EngineConfig) -> tuple[Engine | None, str | None]:
    try:
        return Engine.load(name, config), None
    except Exception as exc:  # any load failure is this rank's reason to give
        return None, f"{type(exc).__name__}: {exc}"


def agree_on_load(name: str, error: str | None, group: mx.distributed.Group) -> list[str]:
    """Every rank says whether it loaded the model (and its host); all learn every host, or
    every rank raises ``ValueError`` with each failed rank's reason."""
    mine = json.dumps({"host": socket.gethostname(), "error": error}).encode()
    said = [json.loads(blob) for blob in gather_bytes(mine, group)]
    failed = [
        f"rank {rank} ({entry['host']}): {entry['error']}"
        for rank, entry in enumerate(said)
        if entry["error"] is not None
    ]
    if failed:
        raise ValueError(
            f"could not load model '{name}' on every replica, so nothing was run: "
            + "; ".join(failed)
            + ". Every rank needs the model at the same path or hub id"
        )
    return [entry["host"] for entry in said]


def portable(output: RequestOutput) -> RequestOutput:
    """A finished output that holds everything it shows (its text detokenized, its lists
    copied), so it can be pickled to rank 0 without the request it came from."""
    copy = RequestOutput(
        output.request_id,
        list(output.token_ids),
        [],
        True,
        output.finish_reason,
        output.metrics,
        output.step,
        output.error,
        output.logprobs,
        output.top_logprobs,
        output.capped_max_tokens,
        FixedText(output.text, "", output.reasoning, ""),
    )
    copy.embedding = output.embedding  # a float32 numpy vector, or None
    copy.score = output.score
    copy.step_failed = output.step_failed
    return copy


def ended(request_id: str, reason: FinishReason, error: str | None = None) -> RequestOutput:
    """The final output of a request that never ran (aborted, or refused by a replica)."""
    now = time.monotonic()
    metrics = RequestMetrics(arrival_time=now, finished_time=now)
    return RequestOutput(request_id, [], [], True, reason, metrics, 0, error)


@dataclass
class _Held:
    """A request rank 0 knows of: as given (for a replica to prepare) and as prepared here."""

    source: tuple[PromptInput, Params]
    request: Request | None = None
    replica: int | None = None  # who runs it, once handed out


class ReplicatedEngine:
    """Rank 0's view of every replica, used as an ``Engine`` is by ``macbatch run``: prepare,
    enqueue, step, abort. Replica 0 is this process's own engine."""

    def __init__(self, engine: Engine, group: mx.distributed.Group, hosts: list[str]) -> None:
        self.local = engine
        self.info = engine.info
        self.tokenizer = engine.tokenizer
        self.exchange = Exchange(group)
        window = engine.config.max_num_seqs + 2 * UNIT  # a full batch, and a unit in the post
        self.handout = Handout(len(hosts), window, UNIT)
        self.tallies = [ReplicaTally(rank, host) for rank, host in enumerate(hosts)]
        self.lost: str | None = None  # why the replicas cannot go on (rank 0 stops handing out)
        self.handout_s = 0.0  # rank 0's time spent handing out and taking back, not running
        self._held: dict[str, _Held] = {}
        self._ready: list[RequestOutput] = []
        self._started = time.monotonic()
        self._block = engine.info.block_size
        atexit.register(self.close)

    # -- what the caller asks of an engine ---------------------------------------------------

    def prepare_request(
        self,
        prompt: Prompt | PromptInput,
        params: Params,
        request_id: str | None,
    ) -> Request:
        """Check and tokenize here (thread-safe, as ``Engine.prepare_request``); the replica
        that runs it prepares it again from what was given."""
        given = prompt_input(prompt)
        request = self.local.prepare_request(given, params, request_id)
        self._held[request.request_id] = _Held((given, params))
        return request

    def enqueue(self, request: Request) -> None:
        held = self._held[request.request_id]
        if self.lost is not None:
            self._held.pop(request.request_id)
            self._ready.append(ended(request.request_id, FinishReason.ABORT))
            return
        held.request = request
        # rows whose prompts share their first block share a prefix-cache entry
        self.handout.add(request.request_id, tuple(request.prompt_token_ids[: self._block]))

    def abort(self, request_id: str) -> None:
        held = self._held.get(request_id)
        if held is None:
            return
        if held.replica is None:  # queued here (its final output comes now) or never queued
            del self._held[request_id]
            if self.handout.remove(request_id):
                self._ready.append(ended(request_id, FinishReason.ABORT))
        elif held.replica == 0:
            self.local.abort(request_id)
        else:
            self.exchange.post(held.replica, Abort([request_id]))

    def step(self) -> list[RequestOutput]:
        """Hand out what waits, run one step of the local engine, and return every output that
        came back meanwhile (an idle rank 0 waits briefly for the replicas instead)."""
        began = time.perf_counter()
        if self.lost is None and (problem := self.exchange.problem()) is not None:
            self._lose(problem)
        if self.lost is None:
            self._hand_out()
        outputs, self._ready = self._ready, []
        for sender, message in self.exchange.take():
            outputs += [self._settle(sender, o) for o in message.outputs]
        self.handout_s += time.perf_counter() - began
        if self.local.has_unfinished():
            outputs += [self._settle(0, o) if o.finished else o for o in self.local.step()]
        elif not outputs and self.lost is None:
            self.exchange.wait(IDLE_S)
        return outputs

    def stats(self) -> EngineStats:
        """Rank 0's own engine's (its KV usage is what the display shows)."""
        return self.local.stats()

    def replica_stats(self) -> dict[str, Any]:
        """Each replica's share of the run, and rank 0's hand-out time (for the summary)."""
        return {
            "replicas": [tally.as_dict(self._started) for tally in self.tallies],
            "handout_s": round(self.handout_s + self.exchange.busy_s, 3),
        }

    def close(self) -> None:
        """End the replicas' exchange (every rank then exits), once."""
        if not self.exchange.ended and self.lost is None:
            self.exchange.finish(self.exchange.timeout_s)

    # -- inside --------------------------------------------------------------------------------

    def _hand_out(self) -> None:
        for replica, request_ids in self.handout.assign().items():
            assigned = []
            for request_id in request_ids:
                held = self._held[request_id]
                held.replica = replica
                if replica == 0:
                    assert held.request is not None
                    self.local.enqueue(held.request)
                else:
                    assigned.append((request_id, *held.source))
                held.request = None  # a remote replica prepares its own
            if assigned:
                self.exchange.post(replica, Assign(assigned))

    def _settle(self, replica: int, output: RequestOutput) -> RequestOutput:
        """A final output from ``replica``: it frees room there, and counts as its work."""
        if self._held.pop(output.request_id, None) is not None:
            self.handout.finished(replica)
        if output.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            tally = self.tallies[replica]
            tally.requests += 1
            tally.generated_tokens += output.metrics.generated_tokens
            tally.last_finished = time.monotonic()
        return output

    def _lose(self, problem: str) -> None:
        """The replicas cannot go on: everything not handed out or held by another replica comes
        back aborted (not written: a rerun runs it); rank 0's own requests finish."""
        self.lost = problem
        self.handout.drain()
        for request_id, held in list(self._held.items()):
            if held.replica != 0:
                del self._held[request_id]
                self._ready.append(ended(request_id, FinishReason.ABORT))
