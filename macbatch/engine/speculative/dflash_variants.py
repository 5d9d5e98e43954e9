"""What DFlash2 and DSpark checkpoints add to a DFlash drafter (docs/speculative.md, "DFlash"),
in the names mlx-vlm 0.7.10's ``dflash2`` and ``dspark`` drafters read.

DFlash2 wraps each layer's attention and MLP in a grouped dynamic causal convolution along the
block's rows (a row reads the rows before it in its own block, never the context), and chooses
each draft among the LM head's top candidates by a low-rank score of the token before it. DSpark
adds a low-rank Markov correction of each draft's logits by the token before it. Both choose a
block's drafts one after another, so a block's tokens are walked as a chain (``chain``) over
every block of the packed forward at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn


def _convolve(x: mx.array, dynamic: mx.array, base: mx.array, within: mx.array) -> mx.array:
    """Rows ``x [N, 1, H]`` convolved causally along their blocks (``within [N]``: a row's index
    in its block; rows before a block's first are zeros), each group of channels by its base
    kernel ``[K, H]`` plus the row's own ``dynamic [N, K, G]`` weights."""
    n, _, width = x.shape
    groups = dynamic.shape[-1]
    rows = x.reshape(n, groups, width // groups)
    out = mx.zeros_like(rows)
    for offset in range(min(base.shape[0], n)):
        values = rows
        if offset:
            shifted = mx.concatenate([mx.zeros_like(rows[:offset]), rows[:-offset]])
            values = shifted * (within >= offset)[:, None, None].astype(x.dtype)
        kernel = base[offset].reshape(1, groups, -1).astype(x.dtype) + dynamic[:, offset, :, None]
        out = out + kernel * values
    return out.reshape(x.shape)


class BlockConv(nn.Module):
    """DFlash2's convolution around a sublayer: ``prepare`` convolves its input and returns
    the kernel that ``finish`` convolves its output with (both computed from the input)."""

    def __init__(self, hidden: int, kernel: int, group: int) -> None:
        super().__init__()
        self.kernel_size = kernel
        self.groups = hidden // group
        self.base_kernel = mx.zeros((2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * self.groups, bias=False)

    def prepare(self, x: mx.array, within: mx.array) -> tuple[mx.array, mx.array]:
        dynamic = self.kernel_projection(x).reshape(x.shape[0], 2, self.kernel_size, -1)
        return _convolve(x, dynamic[:, 0], self.base_kernel[0], within), dynamic[:, 1]

    def finish(self, x: mx.array, dynamic: mx.array, within: mx.array) -> mx.array:
        return _convolve(x, dynamic, self.base_kernel[1], within)


def chain(
    lengths: Sequence[int], anchors: mx.array, step: Callable[[mx.array, mx.array], mx.array]
) -> mx.array:
    """The drafts of blocks of ``lengths`` rows (flat, block after block) chosen one position
    at a time: ``step(rows, previous)`` picks each block's token at its draft row ``rows [B]``
    given the token before it (``anchors [B]`` first). A block shorter than the longest repeats
    its last row; those picks are dropped."""
    starts = [sum(lengths[:b]) for b in range(len(lengths))]
    longest = max(lengths)
    previous = anchors
    picks = []
    for position in range(longest):
        rows = mx.array([s + min(position, k - 1) for s, k in zip(starts, lengths)])
        previous = step(rows, previous)
        picks.append(previous)
    kept = mx.array([b * longest + p for b, k in enumerate(lengths) for p in range(k)])
    return mx.stack(picks, axis=1).reshape(-1)[kept]


class CandidateSelector(nn.Module):
    """DFlash2's choice of a draft: among the ``top_k`` largest logits at its row, the one whose
    logit plus a rank-``rank`` score of (the token before it, the row's hidden state, the
    candidate) is largest."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def __call__(
        self, hidden: mx.array, logits: mx.array, anchors: mx.array, lengths: Sequence[int]
    ) -> mx.array:
        candidates = mx.argpartition(logits, -self.top_k, axis=-1)[:, -self.top_k :]
        unary = mx.take_along_axis(logits, candidates, axis=-1)
        projected = self.hidden_projection(hidden)

        def step(rows: mx.array, previous: mx.array) -> mx.array:
            options = candidates[rows]
            edges = mx.sum(
                self.predecessor_codebook(previous)[:, None]
                * projected[rows][:, None]
                * self.successor_codebook(options),
                axis=-1,
            )
            best = mx.argmax(unary[rows] + edges, axis=-1)
            return mx.take_along_axis(options, best[:, None], axis=-1)[:, 0]

        return chain(lengths, anchors, step)


class MarkovHead(nn.Module):
    """DSpark's choice of a draft: the largest of its row's logits plus a rank-``rank``
    transition score from the token before it."""

    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def __call__(
        self, hidden: mx.array, logits: mx.array, anchors: mx.array, lengths: Sequence[int]
    ) -> mx.array:
        def step(rows: mx.array, previous: mx.array) -> mx.array:
            return mx.argmax(logits[rows] + self.markov_w2(self.markov_w1(previous)), axis=-1)

        return chain(lengths, anchors, step)
