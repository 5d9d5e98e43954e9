"""Prompts to token ids: chat templates (with the caller's template arguments) and the BOS rule.

Rules, each decided here only:
- A text prompt gets the tokenizer's special tokens (BOS) unless it already starts with the BOS
  text, as mlx-lm's ``generate`` does: a hand-templated or pre-rendered prompt keeps one BOS.
- A prompt with images keeps the BOS its template wrote and no other (``one_bos``, in
  ``engine/tokenizer.py``), as transformers' processors tokenize a rendered template; mlx-vlm's
  add another.
- Chat messages are rendered by the model's own template to text, then encoded without special
  tokens (the template writes them), exactly as ``apply_chat_template(tokenize=True)`` does.
- ``chat_template_kwargs`` (``enable_thinking``, ``reasoning_effort`` ...) go to the template as
  variables. Nothing is added by default, so a template's own default holds: mlx-lm's tokenizer
  wrapper would force ``enable_thinking`` on for every template with thinking tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from macbatch.engine.tokenizer import Tokenizer

# Arguments of ``apply_chat_template`` itself, which the engine decides; not template variables.
_RESERVED = (
    "conversation",
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "return_dict",
    "return_tensors",
    "chat_template",
)
THINKING_SWITCH = "enable_thinking"  # the variable templates (Qwen3, Gemma 4 ...) read


def check_chat_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """A validated copy of ``kwargs`` ({} for None); ``ValueError`` says what is wrong."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(
            "chat_template_kwargs must be a mapping of template variable names to values, "
            f"e.g. {{'enable_thinking': false}}; got {kwargs!r}"
        )
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{name!r} in chat_template_kwargs is not a template variable name")
        if name in _RESERVED:
            raise ValueError(
                f"'{name}' is an argument of apply_chat_template that macbatch decides, not a "
                "template variable; leave it out of chat_template_kwargs"
            )
    return dict(kwargs)


def check_content_parts(messages: Sequence[dict[str, Any]]) -> None:
    """``ValueError`` for content parts other than text and checked images (the request layer's
    ``{"type": "image", "image": Image}``): raw OpenAI image or audio parts are refused, not
    dropped."""
    from macbatch.engine.multimodal.images import Image

    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "image" and isinstance(part.get("image"), Image):
                continue
            raise ValueError(
                f"chat message {i} has a content part macbatch cannot read ({kind!r}); parts are "
                "text, or images as macbatch.openai's chat_messages reads image_url parts"
            )


def _hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (or the one given)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of a text prompt: BOS added unless the text already starts with the BOS text."""
    bos = getattr(_hf_tokenizer(tokenizer), "bos_token", None)
    add_special = bos is None or not text.startswith(bos)
    return list(tokenizer.encode(text, add_special_tokens=add_special))


def has_chat_template(tokenizer: Tokenizer) -> bool:
    return bool(
        getattr(tokenizer, "has_chat_template", False)
        or getattr(_hf_tokenizer(tokenizer), "chat_template", None)
    )


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The template's text for ``messages`` followed by the assistant's turn opening."""
    kwargs = check_chat_template_kwargs(chat_template_kwargs)
    # mlx-lm's own Python renderers (set for a few model families) live on the wrapper.
    custom = getattr(tokenizer, "_chat_template", None)
    try:
        if custom is not None:
            return custom(list(messages), add_generation_prompt=True, **kwargs)
        return _hf_tokenizer(tokenizer).apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as exc:  # jinja's TemplateError and the template's own raise_exception
        raise ValueError(f"the model's chat template refused these messages: {exc}") from exc


def template_source(tokenizer: Tokenizer) -> str:
    """The chat template's Jinja text ('' when there is none); several named ones are joined."""
    template = getattr(_hf_tokenizer(tokenizer), "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template or ""


def has_thinking_switch(tokenizer: Tokenizer) -> bool:
    """Whether the template reads ``enable_thinking`` (so thinking can be turned on or off)."""
    return THINKING_SWITCH in template_source(tokenizer)


def thinking_default(tokenizer: Tokenizer) -> bool | None:
    """Whether the template thinks when not told (None: it has no thinking switch), found by
    rendering one question both ways: Qwen3 thinks by default, Gemma 4 does not."""
    if not has_thinking_switch(tokenizer):
        return None
    probe = [{"role": "user", "content": "?"}]
    try:
        untold = render_chat(tokenizer, probe)
        return untold == render_chat(tokenizer, probe, {THINKING_SWITCH: True})
    except ValueError:  # a template that needs more than one question to render: no switch
        return None
