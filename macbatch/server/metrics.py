"""Prometheus text metrics for /metrics: what the server answered and generated (counted here, on
the event loop) plus the engine's own gauges (running, waiting, KV use) from its last snapshot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from macbatch.engine import (
    ACCEPTANCE_BUCKETS,
    ACCEPTED_LENGTH_BUCKETS,
    EngineStats,
    RequestOutput,
    per_request_speculation,
)

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# the prefix cache's tiers: KV pages in memory, and blocks read back from the disk tier
RAM, DISK = "ram", "disk"


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        rows = [
            f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        rows.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        return [*rows, f"{name}_sum {self.total}", f"{name}_count {self.count}"]


@dataclass
class ServerMetrics:
    """Counters updated by the handlers; one instance per app, touched only on its event loop."""

    http_responses: Counter = field(default_factory=Counter)  # (route, status) -> count
    finished: Counter = field(default_factory=Counter)  # finish reason -> engine requests
    prompt_tokens: int = 0
    generation_tokens: int = 0
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    # the prefix cache, by tier: prompt tokens read from it, and engine requests that read any
    cached_tokens: Counter = field(default_factory=Counter)
    cache_hits: Counter = field(default_factory=Counter)
    # per finished request that verified drafts: its acceptance and mean accepted length
    request_acceptance: Histogram = field(default_factory=lambda: Histogram(ACCEPTANCE_BUCKETS))
    request_accepted_length: Histogram = field(
        default_factory=lambda: Histogram(ACCEPTED_LENGTH_BUCKETS)
    )

    def record(self, out: RequestOutput, first_token: bool) -> None:
        """Count one engine output; ``first_token`` on the first output after the first token
        was sampled (an EOS included), when prompt tokens and time to first token are known."""
        self.generation_tokens += len(out.new_token_ids)
        ttft = out.metrics.time_to_first_token_s
        if first_token:
            self.prompt_tokens += out.metrics.prompt_tokens
            disk = out.metrics.disk_cached_tokens
            for tier, tokens in ((RAM, out.metrics.cached_tokens - disk), (DISK, disk)):
                if tokens:
                    self.cached_tokens[tier] += tokens
                    self.cache_hits[tier] += 1
            if ttft is not None:
                self.time_to_first_token.observe(ttft)
        if out.finished and out.finish_reason is not None:
            self.finished[out.finish_reason.value] += 1
            if spec := per_request_speculation(out.metrics.speculation):
                self.request_acceptance.observe(spec[0])
                self.request_accepted_length.observe(spec[1])

    def record_abort(self) -> None:
        """An engine request this server cancelled (client gone, shutdown)."""
        self.finished["abort"] += 1

    def render(self, stats: EngineStats | None, engine_up: bool, pending: int) -> str:
        """The exposition text (format 0.0.4)."""
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, rows: list[str]) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows])

        metric(
            "macbatch_http_responses_total",
            "counter",
            "HTTP responses by route and status code.",
            [
                f'macbatch_http_responses_total{{route="{route}",status="{status}"}} {count}'
                for (route, status), count in sorted(self.http_responses.items())
            ],
        )
        metric(
            "macbatch_requests_total",
            "counter",
            "Engine requests (one per choice) by finish reason.",
            [
                f'macbatch_requests_total{{finish_reason="{reason}"}} {count}'
                for reason, count in sorted(self.finished.items())
            ],
        )
        metric(
            "macbatch_prompt_tokens_total",
            "counter",
            "Prompt tokens of engine requests that produced output.",
            [f"macbatch_prompt_tokens_total {self.prompt_tokens}"],
        )
        metric(
            "macbatch_prefix_cache_tokens_total",
            "counter",
            "Prompt tokens read from the prefix cache, by tier (part of "
            "macbatch_prompt_tokens_total).",
            _by_tier("macbatch_prefix_cache_tokens_total", self.cached_tokens),
        )
        metric(
            "macbatch_prefix_cache_hits_total",
            "counter",
            "Engine requests whose prompt read at least one block from the prefix cache, by tier.",
            _by_tier("macbatch_prefix_cache_hits_total", self.cache_hits),
        )
        metric(
            "macbatch_generation_tokens_total",
            "counter",
            "Tokens generated and passed to clients.",
            [f"macbatch_generation_tokens_total {self.generation_tokens}"],
        )
        name = "macbatch_time_to_first_token_seconds"
        metric(
            name,
            "histogram",
            "Seconds from arrival to first generated token, per engine request.",
            self.time_to_first_token.lines(name),
        )
        for name, help_text, histogram in (
            (
                "macbatch_spec_request_acceptance_rate",
                "Speculative decoding: each finished request's accepted drafted tokens, of its "
                "drafted, 0 to 1 (requests that verified drafts).",
                self.request_acceptance,
            ),
            (
                "macbatch_spec_request_accepted_length",
                "Speculative decoding: each finished request's tokens per verification "
                "(requests that verified drafts).",
                self.request_accepted_length,
            ),
        ):
            metric(name, "histogram", help_text, histogram.lines(name))
        gauges: dict[str, tuple[str, float]] = {
            "macbatch_engine_up": ("1 if the engine thread is running.", int(engine_up)),
            "macbatch_requests_pending": (
                "Engine requests admitted by the server and not finished.",
                pending,
            ),
        }
        if stats is not None:
            gauges.update(
                {
                    "macbatch_requests_running": ("Requests in the running batch.", stats.running),
                    "macbatch_requests_waiting": ("Requests waiting to start.", stats.waiting),
                    "macbatch_kv_blocks_used": ("KV cache blocks in use.", stats.kv_blocks_used),
                    "macbatch_kv_blocks_total": (
                        "KV cache blocks in the pool now (it grows up to the cap).",
                        stats.kv_blocks_total,
                    ),
                    "macbatch_kv_blocks_cap": (
                        "The most KV cache blocks the pool may grow to.",
                        stats.kv_blocks_cap,
                    ),
                    "macbatch_kv_cache_usage_ratio": (
                        "KV cache blocks in use, of the cap, 0 to 1.",
                        stats.kv_usage,
                    ),
                    "macbatch_kv_cache_bytes": ("Bytes of the KV pool now.", stats.kv_cache_bytes),
                    "macbatch_kv_bytes_used": (
                        "Bytes of KV pages (and recurrent states) held by requests and the "
                        "prefix cache.",
                        stats.kv_bytes_used,
                    ),
                    "macbatch_spec_acceptance_rate": (
                        "Speculative decoding: accepted drafted tokens, of all drafted, 0 to 1.",
                        stats.speculation.acceptance_rate,
                    ),
                    "macbatch_spec_mean_accepted_length": (
                        "Speculative decoding: tokens per verification (accepted drafts and "
                        "the target's own).",
                        stats.speculation.mean_accepted_length,
                    ),
                }
            )
        for gauge, (help_text, value) in gauges.items():
            metric(gauge, "gauge", help_text, [f"{gauge} {value}"])
        if stats is not None:
            metric(
                "macbatch_preemptions_total",
                "counter",
                "Requests preempted for lack of KV blocks.",
                [f"macbatch_preemptions_total {stats.preemptions}"],
            )
            for name, help_text, value in (
                ("drafted", "Tokens drafted by speculative decoding.", stats.speculation.drafted),
                (
                    "accepted",
                    "Drafted tokens accepted by verification.",
                    stats.speculation.accepted,
                ),
            ):
                counter = f"macbatch_spec_{name}_tokens_total"
                metric(counter, "counter", help_text, [f"{counter} {value}"])
            metric(
                "macbatch_spec_drafter",
                "gauge",
                "What drafts for speculative decoding (1 on its method; off: none); each "
                "request's acceptance is in macbatch_spec_request_acceptance_rate.",
                [f'macbatch_spec_drafter{{method="{stats.drafter}"}} 1'],
            )
        if stats is not None:
            for name, kind, help_text, value in _disk_samples(stats):
                metric(name, kind, help_text, [f"{name} {value}"])
        return "\n".join(out) + "\n"


def _disk_samples(stats: EngineStats) -> list[tuple[str, str, str, int]]:
    """The disk tier's own numbers (name, type, help, value), as they are now (its writer
    works on while the engine idles: ``EngineThread.stats``); none when the tier is off."""
    disk = stats.disk
    if disk is None:
        return []
    return [
        ("macbatch_disk_cache_read_bytes_total", "counter",
         "Bytes of KV blocks read back from the disk tier (checked).", disk.bytes_read),
        ("macbatch_disk_cache_read_blocks_total", "counter",
         "KV blocks read back from the disk tier (checked).", disk.blocks_read),
        ("macbatch_disk_cache_written_bytes_total", "counter",
         "Bytes of KV block files written to the disk tier (what the SSD wears).",
         disk.bytes_written),
        ("macbatch_disk_cache_written_blocks_total", "counter",
         "KV blocks written to the disk tier.", disk.blocks_written),
        ("macbatch_disk_cache_dropped_writes_total", "counter",
         "KV blocks not written because the writer was too far behind.", disk.writes_dropped),
        ("macbatch_disk_cache_corrupt_blocks_total", "counter",
         "Torn or corrupt KV block files found, skipped and deleted.", disk.corrupt),
        ("macbatch_disk_cache_bytes", "gauge",
         "Bytes of KV block files under the cache directory, every model's (what the cap "
         "covers).", disk.bytes_on_disk),
        ("macbatch_disk_cache_blocks", "gauge",
         "This model's KV blocks on disk.", disk.blocks_on_disk),
    ]  # fmt: skip


def _by_tier(name: str, counts: Counter) -> list[str]:
    """One sample per tier, each from the start (0 before any hit)."""
    tiers = {RAM: 0, DISK: 0, **counts}
    return [f'{name}{{tier="{tier}"}} {count}' for tier, count in sorted(tiers.items())]
