"""What the engine reports of itself (``Engine.stats``): its counters, and the bytes its KV pages
and recurrent states take, the draft model's included (docs/speculative.md, "The draft model in
the pool"; the runner counts them, ``ModelRunner.kv_cache_bytes`` and ``kv_bytes_used``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from macbatch.engine.core.outputs import SpeculationCounts
from macbatch.engine.kv.disk.tier import DiskCounts


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
    # Speculative decoding (docs/speculative.md): drafted, accepted, verifications since the
    # start; of ``kv_bytes_used``, a draft model's pages (in the same blocks as the target's)
    # and a hybrid draft's states.
    speculation: SpeculationCounts = field(default_factory=SpeculationCounts)
    # The disk tier's counts since the start (bytes written: what the SSD wears), None: off.
    disk: DiskCounts | None = None
    draft_kv_bytes: int = 0
    # what drafts (the speculative mode "auto" resolved to: "mtp", "eagle3", "ngram" ...)
    drafter: str = "off"

    @property
    def kv_usage(self) -> float:
        """Blocks taken by requests, of the most the pool may hold."""
        return self.kv_blocks_used / self.kv_blocks_cap if self.kv_blocks_cap else 0.0
