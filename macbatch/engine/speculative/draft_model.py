"""A draft model: a small model with the target's tokenizer proposes the next tokens greedily.

Each speculating request keeps its own mlx-lm KV cache of the draft model (a draft model is
small: Qwen3-0.6B's eighth holds about 14 KiB per token in float32), synced to the request's
sequence before each proposal: the tokens it holds past the longest prefix it shares with the
sequence (rejected drafts) are trimmed, the new ones (accepted drafts and the target's token)
fed. Drafting is greedy, so the draft distribution is a point mass (verify.py). Its bytes are
reported apart from the target's pool (``EngineStats.draft_kv_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from macbatch.engine.speculative.protocol import DraftRequest


class DraftModelDrafter:
    def __init__(self, model: nn.Module, target_vocab_size: int) -> None:
        vocab = getattr(getattr(model, "args", None), "vocab_size", None)
        if vocab is not None and vocab != target_vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({vocab} tokens) is not the target's "
                f"({target_vocab_size}): a draft model must share the target's tokenizer"
            )
        self.model = model
        self._caches: dict[str, tuple[list[Any], list[int]]] = {}  # cache, tokens it holds

    def propose(self, requests: Sequence[DraftRequest], ks: Sequence[int]) -> list[list[int]]:
        return [self._draft(r.request_id, r.all_token_ids, k) for r, k in zip(requests, ks)]

    def _draft(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        cache, held = self._caches.get(request_id) or (make_prompt_cache(self.model), [])
        keep = _shared_prefix(held, tokens, len(tokens) - 1)  # at least the last token is fed
        trim_prompt_cache(cache, len(held) - keep)
        logits = self.model(mx.array(tokens[keep:])[None], cache=cache)
        # Each draft feeds the next on the device: one graph, read back once (no host round
        # trip per draft token).
        drafted = [mx.argmax(logits[0, -1])]
        for _ in range(k - 1):
            drafted.append(mx.argmax(self.model(drafted[-1].reshape(1, 1), cache=cache)[0, -1]))
        drafts = cast(list[int], mx.stack(drafted).tolist())
        self._caches[request_id] = (cache, tokens + drafts[:-1])
        return drafts

    def forget(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for cache, _ in self._caches.values() for c in cache)


def _shared_prefix(a: list[int], b: list[int], most: int) -> int:
    n = min(len(a), len(b), most)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
