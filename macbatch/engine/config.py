"""Engine sizing knobs, validated once so a typo fails at start, not mid-run."""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.speculative.methods import DEFAULT_SPECULATIVE_TOKENS, check_speculative
from macbatch.metal.quant import check_kv_quantization


@dataclass(frozen=True)
class EngineConfig:
    """How big the KV pool is and how much work one step may pack.

    ``num_blocks`` fixes the pool size; when it is None the pool is elastic (kv/elastic.py):
    it starts small, grows as requests need blocks up to ``memory_fraction`` of the memory left
    after the weights (capped at what ``max_num_seqs`` full-length sequences need), starting
    from ``kv_start_mib`` MiB of pages (256: a short chat or a few requests, without a copy;
    1,170 tokens of a Qwen3-0.6B-shaped float32 model, 2,340 in float16), and shrinks back to
    that once the engine thread has been idle for ``kv_shrink_after_s`` seconds (None: never).
    ``dtype`` None keeps the model's dtype on Metal; on CPU a model the engine loads itself is
    cast to float32 (the only dtype MLX's CPU backend runs through BLAS) if it fits in memory,
    and a caller's model keeps its dtype (see ``compute_dtype.py``). ``kv_bits`` 8 or 4 stores
    K/V pages quantized (affine, one float16 scale and bias per ``kv_group_size`` head-dim
    elements of each token: 64 or 32, None for the default), None keeps float pages.
    ``pipelined`` builds and dispatches step N+1 while step N runs on the device (see
    docs/engine.md; a distributed engine always steps synchronously); False runs each step
    synchronously, which benchmarks use to show what the pipeline takes off the host's
    critical path. ``speculative`` picks a drafter (``SPECULATIVE_MODES`` in
    speculative/methods.py; docs/speculative.md): "ngram" (prompt lookup), "draft"
    (``draft_model``, a small model with the same tokenizer), "mtp" (the checkpoint's own MTP
    layer), "auto" ("mtp" where the checkpoint has one, else "off": the front ends' default),
    "off"; ``num_speculative_tokens`` is the most tokens drafted per request per step
    (None: ``DEFAULT_SPECULATIVE_TOKENS`` of the method).
    ``compile_decode_after``: small decode steps run compiled once this many of them ran
    uncompiled (compiled_step.py; None: never compiled).
    """

    block_size: int = 16
    num_blocks: int | None = None
    memory_fraction: float = 0.5
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 64
    max_model_len: int | None = None
    dtype: str | None = None
    enable_prefix_caching: bool = True
    kv_bits: int | None = None
    kv_group_size: int | None = None
    pipelined: bool = True
    kv_start_mib: float = 256.0
    kv_shrink_after_s: float | None = 30.0
    reranker: bool | None = None  # a yes/no cross-encoder (None: its name says "rerank")
    compile_decode_after: int | None = 64
    speculative: str = "off"
    num_speculative_tokens: int | None = None
    draft_model: str | None = None
    # the disk tier below the prefix cache (docs/engine.md, "The disk tier"): its directory
    # (None: off, as for every engine a test builds; the front ends turn it on) and its byte cap
    # (None: 20 GiB or a tenth of the free space, whichever is smaller)
    disk_cache_dir: str | None = None
    disk_cache_bytes: int | None = None

    @property
    def draft_length(self) -> int:
        """The most tokens a request drafts per step: the given length, else the method's
        default (0 for "off", which drafts nothing)."""
        given = self.num_speculative_tokens
        return DEFAULT_SPECULATIVE_TOKENS.get(self.speculative, 0) if given is None else given

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32):
            raise ValueError(f"block_size must be 8, 16 or 32, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {self.num_blocks}")
        if not 0.0 < self.memory_fraction <= 0.95:
            raise ValueError(f"memory_fraction must be in (0, 0.95], got {self.memory_fraction}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(
                f"dtype must be float32, float16 or bfloat16 (or unset), got {self.dtype!r}"
            )
        if self.kv_start_mib < 0:
            raise ValueError(f"kv_start_mib must be at least 0, got {self.kv_start_mib}")
        if self.kv_shrink_after_s is not None and self.kv_shrink_after_s < 0:
            raise ValueError(
                f"kv_shrink_after_s must be at least 0 (or None), got {self.kv_shrink_after_s}"
            )
        after = self.compile_decode_after
        if after is not None and after < 0:
            raise ValueError(f"compile_decode_after must be at least 0 (or None), got {after}")
        if self.disk_cache_bytes is not None and self.disk_cache_bytes < 0:
            raise ValueError(f"disk_cache_bytes must be at least 0, got {self.disk_cache_bytes}")
        check_kv_quantization(self.kv_bits, self.kv_group_size)
        check_speculative(self.speculative, self.num_speculative_tokens)
