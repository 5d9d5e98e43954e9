"""Engine sizing knobs, validated once so a typo fails at start, not mid-run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from macbatch.engine.speculative.methods import DEFAULT_SPECULATIVE_TOKENS, check_speculative
from macbatch.engine.stores.fp8_keys import check_indexer_keys
from macbatch.metal.quant import check_kv_quantization


def knob(default: Any, doc: str) -> Any:
    """A field with its own doc (``fields(EngineConfig)[i].metadata["doc"]``), so each knob is
    explained where it is declared; the command line's help for it is in
    ``macbatch/commands/options.EngineKnobs``."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class EngineConfig:
    """How big the KV pool is and how much work one step may pack; each field's doc says what it
    sets and why its default is what it is."""

    block_size: int = knob(16, "Tokens per KV block (8, 16 or 32): the pool's unit.")
    num_blocks: int | None = knob(
        None,
        "A fixed pool of this many blocks; None: the pool is elastic (kv/elastic.py): it "
        "starts small and grows as requests need blocks, up to ``memory_fraction``.",
    )
    memory_fraction: float = knob(
        0.5,
        "The most an elastic pool grows to, as a share of the memory left after the weights "
        "(capped at what ``max_num_seqs`` full-length sequences need).",
    )
    max_num_batched_tokens: int = knob(
        1024, "Tokens one step may pack (chunked prefill splits longer prompts)."
    )
    max_num_seqs: int = knob(64, "Sequences running at once: the running batch.")
    max_model_len: int | None = knob(
        None, "The context length, prompt and reply (None: the model's own; model_info.py)."
    )
    dtype: str | None = knob(
        None,
        "None keeps the model's dtype on Metal; on CPU a model the engine loads itself is cast "
        "to float32 (the only dtype MLX's CPU backend runs through BLAS) if it fits in memory, "
        "and a caller's model keeps its dtype (see ``compute_dtype.py``).",
    )
    enable_prefix_caching: bool = knob(
        True, "Requests that share a prompt prefix share its KV blocks."
    )
    kv_bits: int | None = knob(
        None,
        "8 or 4: K/V pages stored quantized (affine, one float16 scale and bias per "
        "``kv_group_size`` head-dim elements of each token); None keeps float pages.",
    )
    kv_group_size: int | None = knob(
        None, "The quantized pages' group: 64 or 32 (None: the default for ``kv_bits``)."
    )
    indexer_keys: str | None = knob(
        None,
        "A sparse-attention model's lightning-indexer keys: 'fp8' stores them as DeepSeek "
        "V3.2's reference does (e4m3, a float32 scale per 128 columns: 132 bytes per token per "
        "layer for 128-wide keys; ``stores/fp8_keys.py``); None keeps them in the latent pages' "
        "format (the model's dtype, or ``kv_bits``), which mlx-lm's selection matches exactly.",
    )
    pipelined: bool = knob(
        True,
        "Build and dispatch step N+1 while step N runs on the device (docs/engine.md; a "
        "distributed engine always steps synchronously); False runs each step synchronously, "
        "which benchmarks use to show what the pipeline takes off the host's critical path.",
    )
    kv_start_mib: float = knob(
        256.0,
        "MiB of pages an elastic pool starts from, and shrinks back to (256: a short chat or a "
        "few requests, without a copy; 1,170 tokens of a Qwen3-0.6B-shaped float32 model, "
        "2,340 in float16).",
    )
    kv_shrink_after_s: float | None = knob(
        30.0,
        "Seconds the engine thread is idle before an elastic pool shrinks back to "
        "``kv_start_mib`` (None: never).",
    )
    reranker: bool | None = knob(
        None, 'The model is a yes/no cross-encoder (None: its name says "rerank").'
    )
    self_check: bool = knob(
        True,
        "``Engine.load`` runs a short prompt through the packed step and through the model "
        "library's own forward and refuses the model when their log-probabilities differ "
        "(self_check.py); False skips it (``--no-self-check``).",
    )
    compile_decode_after: int | None = knob(
        64,
        "Small decode steps run compiled once this many of them ran uncompiled "
        "(compiled_step.py; None: never compiled).",
    )
    speculative: str = knob(
        "off",
        "The drafter (``SPECULATIVE_MODES`` in speculative/methods.py; docs/speculative.md): "
        '"ngram" (prompt lookup), "draft" (``draft_model``), "mtp" (the checkpoint\'s own '
        'MTP layer), "auto" ("mtp" where the checkpoint has one, else "off": the front '
        'ends\' default), "off" (every engine a test builds).',
    )
    num_speculative_tokens: int | None = knob(
        None,
        "The most tokens drafted per request per step (None: ``DEFAULT_SPECULATIVE_TOKENS`` of "
        "the method).",
    )
    draft_model: str | None = knob(
        None, 'The drafter of "draft": a small model with the same tokenizer.'
    )
    disk_cache_dir: str | None = knob(
        None,
        'The disk tier below the prefix cache (docs/engine.md, "The disk tier"): its '
        "directory; None: off, as for every engine a test builds (the front ends turn it on).",
    )
    disk_cache_bytes: int | None = knob(
        None, "The disk tier's byte cap (None: 20 GiB or a tenth of the free space, if smaller)."
    )
    adapters: tuple[tuple[str, str], ...] = knob(
        (),
        "LoRA / DoRA adapters a request may name, as (name, directory) pairs in mlx-lm's or "
        'PEFT\'s format (engine/lora/; docs/models.md, "Fine-tunes"): each step adds every '
        "row's adapter to the base weights' output, never fused into them.",
    )

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
        names = [name for name, _ in self.adapters]
        if len(set(names)) < len(names) or not all(names):
            raise ValueError(f"adapter names must be distinct and non-empty, got {names}")
        check_kv_quantization(self.kv_bits, self.kv_group_size)
        check_indexer_keys(self.indexer_keys)
        check_speculative(self.speculative, self.num_speculative_tokens)
