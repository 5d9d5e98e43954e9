"""The indexer-keys cache group: a DeepSeek Sparse Attention model's (DeepSeek V3.2, GLM-5)
latent pages with its lightning indexer's keys beside them, one ``index_head_dim`` row per token
per layer (``model/sparse_indexer.py`` scores them).

The indexer needs a key at exactly the positions the latent pages keep, for exactly as long, so
its rows are pages of the same blocks: layers of their own in the latent group's ``KVStore``
(``LayerShape.value_dim`` 0: key rows only), addressed by the same block ids. So the prefix
cache names both under one chain digest, the disk tier writes and reads both in a block's part
(``KVStore.gather_blocks``), a preempted request gives back and recomputes both, and a block's
bytes (``bytes_per_block``) are both, which sizes the pool and doctor's KV bytes per token. vLLM
keeps DeepSeek V3.2's indexer cache the same way: in the MLA layers' KV cache group, on their
block table. The pages are in the model's dtype, or the engine's 8- and 4-bit page formats
(``EngineConfig.kv_bits``) like the latent's, or fp8 as DeepSeek's reference keeps them (e4m3
with a float32 scale per 128 columns: ``EngineConfig.indexer_keys``, ``stores/fp8_keys.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.kv.latent import LatentGroup, LatentSpec


@dataclass(frozen=True)
class IndexerKeysSpec(LatentSpec):
    """``bytes_per_block``: the latent rows and the indexer's key rows of one block;
    ``index_bytes_per_block``: the key rows' part of it."""

    index_bytes_per_block: int = 0


class IndexerKeysGroup(LatentGroup):
    """The latent group's blocks, whose pages hold the indexer's keys too."""
