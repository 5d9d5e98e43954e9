"""The token ids a chat prompt should become, from Hugging Face's own tokenizer and chat template
(an oracle independent of macbatch's prompt building), and how long a prefix a set of them
shares (what the prefix cache can reuse)."""

from __future__ import annotations

from pathlib import Path


def chat_prompt_tokens(model: Path, system: str, prompts: list[str]) -> list[list[int]]:
    """The oracle for each row's prompt: Hugging Face's tokenizer and chat template for the
    model, the system message and one user message."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": text}],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        for text in prompts
    ]


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares."""
    shared = 0
    while all(len(p) > shared and p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    return shared
