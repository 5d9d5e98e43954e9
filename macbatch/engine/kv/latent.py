"""The latent cache group: an MLA model's (multi-head latent attention: DeepSeek V2/V3, Kimi K2,
GLM-4.7-Flash, MiniCPM3, Mistral Small 4) pages, one row per token per layer holding the
compressed latent (``kv_lora_rank``) then the shared RoPE key (``qk_rope_head_dim``), instead of
a key and a value for every head: 10x to 100x less than a per-head cache.

Every position's row is kept for as long as the request runs, as full attention keeps its K/V, so
the group is the full group's block logic (its room decides the scheduler's, the prefix cache
finds a prefix in it, drafts are truncated in it, a draft model's pages share its block ids):
what differs is the pages its blocks address (``stores/pages.py``: one "KV head" of width
``kv_lora_rank + qk_rope_head_dim``, no value pages), and so its bytes per block. An MLA model's
layers are all latent, so this group is its first (``KVManager``'s full group), and a block's
rows are gathered and scattered as the full group's (``KVStore.gather_blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.kv.full import FullAttentionGroup, FullAttentionSpec


@dataclass(frozen=True)
class LatentSpec(FullAttentionSpec):
    """``bytes_per_block``: the latent layers' rows of one block, scales included."""


class LatentGroup(FullAttentionGroup):
    """Full attention's blocks over latent pages."""
