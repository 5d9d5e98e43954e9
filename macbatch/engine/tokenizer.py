"""What macbatch needs of a tokenizer, as a protocol: every layer types its tokenizer with it
instead of ``Any`` (mlx-lm's ``TokenizerWrapper`` and a Hugging Face tokenizer both fit)."""

from __future__ import annotations

from typing import Any, Protocol


class Tokenizer(Protocol):
    """What macbatch needs of a tokenizer (mlx-lm's ``TokenizerWrapper`` is one): text to ids
    and back. Chat templating goes through ``chat_template.py``, which reads the rest."""

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: list[int], *args: Any, **kwargs: Any) -> str: ...


def one_bos(tokenizer: Any, text: str, ids: list[int]) -> list[int]:
    """``ids`` of ``text`` (by ``tokenizer``, a processor's Hugging Face tokenizer) with as many
    leading BOS tokens as the text writes: mlx-vlm has most processors tokenize a rendered
    template (which writes its BOS) with the tokenizer's special tokens again, a second BOS
    that transformers' ``apply_chat_template`` and the text path never add."""
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return ids
    written = 0
    while text.startswith(bos, written * len(bos)):
        written += 1
    leading = next((i for i, token in enumerate(ids) if token != bos_id), len(ids))
    return ids[leading - written :] if leading > written else ids
