"""A random encoder checkpoint saved in the Hugging Face layout, and a text corpus of chosen
token lengths, for the encoder benchmark: every peer (mlx-embeddings, sentence-transformers)
loads the same directory with its own loader and tokenizes the same texts with the same real
tokenizer (the BERT WordPiece / XLM-R Unigram ones vendored for the encoder tests, read as
files), so all sides run one model on one corpus.

The directory is what ``BertModel`` / ``XLMRobertaModel.save_pretrained`` writes (config.json,
model.safetensors under the base model's weight names) plus a sentence-transformers pipeline
(modules.json: Transformer -> CLS Pooling -> Normalize) and a ``tokenizer_config.json`` for
transformers' ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from tests.support.encoder_checkpoints import random_weights

ROOT = Path(__file__).parents[1]
TOKENIZERS = ROOT / "tests" / "support" / "tokenizers"

# the two shapes measured: (config.json, vendored tokenizer, its specials)
BERT_BASE = {
    "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522,
    "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
    "max_position_embeddings": 2048, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    "hidden_act": "gelu", "pad_token_id": 0,
}  # fmt: skip
BGE_M3 = {
    "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": 250002,
    "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096,
    "max_position_embeddings": 8194, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
    "hidden_act": "gelu", "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
}  # fmt: skip
SHAPES = {
    "bert": (BERT_BASE, "bert-wordpiece", {"cls_token": "[CLS]", "sep_token": "[SEP]",
             "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}),
    "m3": (BGE_M3, "xlmr-unigram", {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>",
           "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
           "mask_token": "<mask>"}),
}  # fmt: skip


def write_checkpoint(directory: Path, shape: str, layers: int) -> Path:
    """The shape's random checkpoint (cut to ``layers``) with its tokenizer and CLS pooling,
    normalized, embedding up to its position table's length."""
    base, tokenizer, specials = SHAPES[shape]
    config = dict(base, num_hidden_layers=layers)
    longest = config["max_position_embeddings"] - (2 if shape == "m3" else 0)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    # BERT's initializer range throughout, so activations stay in a trained model's range
    weights = random_weights(config, std=0.02, embedding_std=(0.02, 0.02))
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "tokenizer.json").write_text(
        (TOKENIZERS / tokenizer / "tokenizer.json").read_text()
    )
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": longest}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | specials))
    _write_sentence_transformers(directory, config["hidden_size"], longest)
    return directory


def _write_sentence_transformers(directory: Path, hidden: int, longest: int) -> None:
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_lasttoken": False}  # fmt: skip
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    settings = {"max_seq_length": longest, "do_lower_case": False}
    (directory / "sentence_bert_config.json").write_text(json.dumps(settings))


def texts_of_lengths(directory: Path, lengths: list[int], seed: int = 1) -> list[str]:
    """One text per length: a span of the project's docs/*.md (real English) that the
    checkpoint's tokenizer reads as about that many tokens, its specials included."""
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    corpus = " ".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    corpus = " ".join(corpus.split())
    encoding = tokenizer.encode(corpus, add_special_tokens=False)
    offsets, words = encoding.offsets, encoding.word_ids
    starts = [i for i in range(1, len(words)) if words[i] != words[i - 1]]
    rng = np.random.default_rng(seed)
    texts = []
    for n in lengths:
        body = n - tokenizer.num_special_tokens_to_add(False)
        start = starts[int(rng.integers(0, np.searchsorted(starts, len(offsets) - body)))]
        texts.append(corpus[offsets[start][0] : offsets[start + body - 1][1]])
    return texts
