"""Where a prompt's images sit: the positions of their placeholder rows, and the key those rows
hash under in the prefix cache (the images' content, so different images never share blocks),
and, for a family whose image rows attend both ways within an image (Gemma 4), the spans that
must be computed whole: in one prefill chunk, never resumed from the prefix cache midway."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from macbatch.engine.multimodal.images import Image


@dataclass
class PromptImages:
    images: tuple[Image, ...]
    positions: np.ndarray  # prompt positions of every image row, ascending
    # M-RoPE families (engine/multimodal/qwen_vl.py): every prompt row's three-part position, and
    # the shift
    # of every position after the prompt. None: rows sit at their 1-D positions.
    rope: np.ndarray | None = None
    rope_delta: int = 0
    # Gemma 4 (engine/model/image_blocks.py): ``[K, 2]`` prompt positions ``[start, stop)`` of
    # each
    # image's rows, which attend to each other both ways. None: image rows are causal rows.
    blocks: np.ndarray | None = None
    # A negative id (token ids are not) from every image's digest, in order: a placeholder row
    # hashes as this instead of its token, so a block's hash covers the images it shows.
    key: int = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.blake2b(digest_size=7)
        for image in self.images:
            digest.update(bytes.fromhex(image.digest))
        self.key = -1 - int.from_bytes(digest.digest(), "big")

    def rows_between(self, start: int, stop: int) -> tuple[int, int]:
        """The image rows (indices into ``positions``) at positions ``start:stop``."""
        lo, hi = np.searchsorted(self.positions, [start, stop])
        return int(lo), int(hi)

    def hash_tokens(self, tokens: list[int], start: int) -> list[int]:
        """``tokens`` (positions ``start:``) with image rows replaced by the images' key."""
        lo, hi = self.rows_between(start, start + len(tokens))
        if lo == hi:
            return tokens
        keyed = list(tokens)
        for position in self.positions[lo:hi]:
            keyed[int(position) - start] = self.key
        return keyed

    def chunk_tokens(self, start: int, count: int) -> int:
        """The most of ``count`` tokens from ``start`` a prefill chunk may take: it never ends
        inside a bidirectional block (0: the block at its end starts at ``start`` and needs
        more room than ``count``)."""
        stop = start + count
        if self.blocks is None:
            return count
        inside = (self.blocks[:, 0] < stop) & (stop < self.blocks[:, 1])
        if not inside.any():
            return count
        return max(0, int(self.blocks[inside, 0][0]) - start)

    def can_resume_at(self, position: int) -> bool:
        """Whether a cached prefix may end at ``position`` (not inside a bidirectional block:
        the rest of the block would miss the keys of the block's start that left a window)."""
        return self.chunk_tokens(0, position) == position

    @property
    def longest_block(self) -> int:
        """The rows of the longest bidirectional block (0: none): one prefill chunk's minimum."""
        if self.blocks is None or not len(self.blocks):
            return 0
        return int((self.blocks[:, 1] - self.blocks[:, 0]).max())
