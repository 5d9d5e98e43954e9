"""Where a prompt's images sit: the positions of their placeholder rows, and the key those rows
hash under in the prefix cache (the images' content, so different images never share blocks)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from macbatch.engine.images import Image


@dataclass
class PromptImages:
    images: tuple[Image, ...]
    positions: np.ndarray  # prompt positions of every image row, ascending
    # M-RoPE families (engine/qwen_vl.py): every prompt row's three-part position, and the shift
    # of every position after the prompt. None: rows sit at their 1-D positions.
    rope: np.ndarray | None = None
    rope_delta: int = 0
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
