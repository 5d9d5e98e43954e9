"""Stand-in tokenizers for model families whose real tokenizers are not vendored (gpt-oss, Gemma 4):
a small byte-level BPE trained in-process with the family's special tokens, and a few words of its
markup added as single tokens (as they are in the real vocabularies), wrapped by mlx-lm's
``TokenizerWrapper`` so that its own inference (thinking markers, EOS ids) runs on it. The chat
template is written by each test, a minimal one in the family's shape, not the real one."""

from __future__ import annotations

from typing import Any

from tests.support.tiny import _CORPUS, VOCAB_SIZE


def standin_tokenizer(
    special: list[str], words: list[str], chat_template: str, eos: list[str]
) -> Any:
    """A ``TokenizerWrapper`` with ``special`` tokens, ``words`` as single plain tokens, ``eos``
    (a subset of ``special``) as its EOS ids; its whole vocabulary fits ``VOCAB_SIZE``."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(words),
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.add_tokens([AddedToken(word, special=False, normalized=False) for word in words])
    assert tokenizer.get_vocab_size() <= VOCAB_SIZE
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos[0])
    hf.chat_template = chat_template
    return TokenizerWrapper(hf, eos_token_ids=[hf.convert_tokens_to_ids(t) for t in eos])


GEMMA4_SPECIAL = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]
GEMMA4_TEMPLATE = (
    "{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def gemma4_tokenizer() -> Any:
    """Gemma 4's thinking markers (``<|channel>thought ... <channel|>``) on the stand-in."""
    return standin_tokenizer(
        GEMMA4_SPECIAL, ["thought", "model", "user"], GEMMA4_TEMPLATE, ["<eos>"]
    )


HARMONY_SPECIAL = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
]
HARMONY_TURNS = (
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
)
# gpt-oss's generation prompt; the model picks its channel.
HARMONY = HARMONY_TURNS + "{% if add_generation_prompt %}<|start|>assistant{% endif %}"


def harmony_tokenizer(template: str) -> Any:
    """gpt-oss's special tokens and channel words on the stand-in; ``<|return|>`` and
    ``<|call|>`` end a reply, as in gpt-oss's generation config."""
    return standin_tokenizer(
        HARMONY_SPECIAL,
        ["assistant", "user", "analysis", "final", "commentary"],
        template,
        eos=["<|return|>", "<|call|>"],
    )
