"""What a request asks the model to continue: the prompt and the things that shape its tokens.

``PromptInput`` replaces the parameter list (prompt, chat_template_kwargs, tools) that every
layer used to repeat: front ends build one, the input processor turns it into token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from macbatch.engine.pooling.embedding_profile import TextPair

# token ids | raw text (no template) | chat messages ({"role": ..., "content": ...}) | a pair
Prompt = Sequence[int] | str | Sequence[dict[str, Any]] | TextPair


@dataclass(frozen=True)
class PromptInput:
    """A prompt with its chat template variables and the OpenAI function tools the template
    renders (both for chat prompts only)."""

    prompt: Prompt
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    adapter: str | None = None  # the fine-tune that answers (engine/lora/), None: the base model

    @property
    def is_chat(self) -> bool:
        return is_chat(self.prompt)


def is_chat(prompt: Prompt) -> bool:
    """Whether ``prompt`` is a list of chat messages (not text, not token ids)."""
    return not isinstance(prompt, str) and bool(prompt) and isinstance(prompt[0], dict)
