"""Trains the BERT WordPiece, XLM-R Unigram and ModernBERT byte-level BPE tokenizers the
encoder tests read (tests/support/tokenizers/bert-wordpiece, xlmr-unigram, modernbert-bpe) with
the ``tokenizers`` library's own trainers on docs/*.md, and writes them there: run it to rebuild
them (all, or the ones named).

    python scripts/train_encoder_tokenizers.py [modernbert-bpe ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
OUT = ROOT / "tests" / "support" / "tokenizers"
VOCAB = 1500
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MODERNBERT_SPECIALS = ["<|endoftext|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def _corpus(lines: int | None = None) -> list[str]:
    text = [line for f in sorted(DOCS.glob("*.md")) for line in f.read_text().splitlines()]
    return text[:lines]


def wordpiece_tokenizer() -> str:
    """A BERT WordPiece tokenizer.json (uncased), as a JSON string."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        _corpus(), trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=BERT_SPECIALS)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok.to_str()


def unigram_tokenizer() -> str:
    """An XLM-R SentencePiece-Unigram tokenizer.json, as a JSON string."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        _corpus(4000),  # Unigram's EM is slow: a fifth of the docs make its 1,500 pieces
        trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=XLMR_SPECIALS, unk_token="<unk>"),
    )
    # the trainer gives the special tokens the first ids, in order: <s> 0, <pad> 1, </s> 2
    ids = {token: XLMR_SPECIALS.index(token) for token in ("<s>", "</s>")}
    tok.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    return tok.to_str()


def bpe_tokenizer() -> str:
    """A ModernBERT byte-level BPE tokenizer.json (OLMo's kind: no prefix space, ``[CLS] A
    [SEP]``), as a JSON string."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _corpus(),
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=MODERNBERT_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok.to_str()


TRAINERS = {
    "bert-wordpiece": wordpiece_tokenizer,
    "xlmr-unigram": unigram_tokenizer,
    "modernbert-bpe": bpe_tokenizer,
}


def main(names: list[str]) -> None:
    for name in names or list(TRAINERS):
        (OUT / name).mkdir(parents=True, exist_ok=True)
        (OUT / name / "tokenizer.json").write_text(TRAINERS[name]())


if __name__ == "__main__":
    main(sys.argv[1:])
