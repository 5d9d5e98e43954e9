"""What macbatch needs of a tokenizer, as a protocol: every layer types its tokenizer with it
instead of ``Any`` (mlx-lm's ``TokenizerWrapper`` and a Hugging Face tokenizer both fit)."""

from __future__ import annotations

from typing import Any, Protocol


class Tokenizer(Protocol):
    """What macbatch needs of a tokenizer (mlx-lm's ``TokenizerWrapper`` is one): text to ids
    and back. Chat templating goes through ``chat_template.py``, which reads the rest."""

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: list[int], *args: Any, **kwargs: Any) -> str: ...
