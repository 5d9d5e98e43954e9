"""Tiny random ``*ForSequenceClassification`` checkpoints of the encoder families whose heads
macbatch builds beyond BERT's and RoBERTa's, each made by transformers' own class (DistilBERT,
MPNet, ELECTRA, DeBERTa-v2, ModernBERT with CLS and mean pooling; gte and Nomic BERT through
transformers' ``Gte`` / ``NomicBert`` classes, which load the remote-code checkpoints: saved
under their published names, the directory then holds the remote code's config and prefix
that macbatch reads), saved in the Hugging Face layout with the vendored real tokenizers; the
oracle is transformers' float64 logits on the same weights and token ids.

torch and transformers' models are not in the test environment: the checkpoints are built by
``transformers_classifier_logits.py`` in a Python that has them (``torch_python``), one
subprocess for all of them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from tests.support.encoder_checkpoints import TOKENIZERS, VOCAB
from tests.support.encoder_families import gte_config, nomic_config

SCRIPT = Path(__file__).with_name("transformers_classifier_logits.py")
# the Python the encoder benchmarks' sentence-transformers peer runs in (docs/embeddings.md)
PEER_PYTHON = Path("/work/venvs/st/bin/python")
_TINY = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 96, "num_labels": 1}  # fmt: skip


@dataclass(frozen=True)
class ClassifierFamily:
    name: str
    transformers_class: str
    config: dict  # transformers' config arguments
    tokenizer: str  # a folder of tests/support/tokenizers
    types: bool = False  # its forward reads token types
    # the remote code's config.json macbatch reads, and transformers' prefix -> the remote
    # code's (gte's ``NewForSequenceClassification``, Nomic's), where transformers names them
    # otherwise
    published: dict | None = None
    prefix: tuple[str, str] | None = None
    seed: int = 0

    @property
    def config_class(self) -> str:
        return self.transformers_class.removesuffix("ForSequenceClassification") + "Config"


_MODERNBERT = {"num_hidden_layers": 4, "global_attn_every_n_layers": 3, "local_attention": 16,
               "max_position_embeddings": 512, "pad_token_id": 4, "bos_token_id": 2,
               "eos_token_id": 3, "cls_token_id": 2, "sep_token_id": 3}  # fmt: skip
_ONE_LABEL = {"id2label": {"0": "LABEL_0"}, "vocab_size": VOCAB}

FAMILIES = (
    ClassifierFamily(
        "distilbert", "DistilBertForSequenceClassification",
        {"vocab_size": VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 96,
         "num_labels": 1, "pad_token_id": 0}, "bert-wordpiece",
    ),
    ClassifierFamily(
        "mpnet", "MPNetForSequenceClassification",
        _TINY | {"max_position_embeddings": 514, "layer_norm_eps": 1e-5, "pad_token_id": 1},
        "xlmr-unigram",
    ),
    ClassifierFamily(
        "electra", "ElectraForSequenceClassification",
        _TINY | {"embedding_size": 32}, "bert-wordpiece", types=True,
    ),
    ClassifierFamily(
        "deberta-v2", "DebertaV2ForSequenceClassification",
        _TINY | {"relative_attention": True, "position_buckets": 32,
                 "max_relative_positions": 128, "norm_rel_ebd": "layer_norm",
                 "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
                 "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
                 "pooler_hidden_size": 64, "pooler_hidden_act": "gelu", "pad_token_id": 0},
        "bert-wordpiece",
    ),
    ClassifierFamily(
        "modernbert", "ModernBertForSequenceClassification", _TINY | _MODERNBERT,
        "modernbert-bpe",
    ),
    # the other pooling, a dense bias and another activation, each from the config
    ClassifierFamily(
        "modernbert-mean", "ModernBertForSequenceClassification",
        _TINY | _MODERNBERT | {"classifier_pooling": "mean", "classifier_bias": True,
                               "classifier_activation": "silu"},
        "modernbert-bpe", seed=1,
    ),
    # gte-multilingual-reranker-base's shape: XLM-R's Unigram, one token type, plain RoPE
    ClassifierFamily(
        "gte", "GteForSequenceClassification",
        _TINY | {"max_position_embeddings": 8192, "type_vocab_size": 1, "pad_token_id": 1,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 160000.0}},
        "xlmr-unigram",
        published=gte_config(multilingual=True)
        | _ONE_LABEL | {"architectures": ["NewForSequenceClassification"]},
        prefix=("gte.", "new."),
    ),
    ClassifierFamily(
        "nomic_bert", "NomicBertForSequenceClassification",
        _TINY | {"max_position_embeddings": 8192, "type_vocab_size": 2,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
        "bert-wordpiece", types=True,
        published=nomic_config()
        | _ONE_LABEL | {"architectures": ["NomicBertForSequenceClassification"]},
        prefix=("nomic_bert.", "bert."),
    ),
)  # fmt: skip


@dataclass
class BuiltClassifier:
    path: Path
    tokenizer: Tokenizer
    inputs: list[tuple[list[int], list[int]]] = field(default_factory=list)
    logits: np.ndarray = field(default_factory=lambda: np.zeros(0))  # float64 [pairs]


def torch_python() -> str | None:
    """A Python with torch and transformers: this one, else the benchmarks' peer venv's."""
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    return str(PEER_PYTHON) if PEER_PYTHON.exists() else None


def build_classifiers(
    root: Path, pairs: list[tuple[str, str]], families: tuple[ClassifierFamily, ...] = FAMILIES
) -> dict[str, BuiltClassifier]:
    """Each family's checkpoint under ``root`` / name, with ``pairs`` tokenized by its
    tokenizer and transformers' logit for each."""
    python = torch_python()
    assert python is not None, "no Python with torch and transformers"
    built, job = {}, []
    for family in families:
        path = root / family.name
        tokenizer = Tokenizer.from_file(str(TOKENIZERS / family.tokenizer / "tokenizer.json"))
        encodings = [tokenizer.encode(q, d) for q, d in pairs]
        inputs = [(e.ids, e.type_ids) for e in encodings]
        built[family.name] = BuiltClassifier(path, tokenizer, inputs)
        job.append({"name": family.name, "class": family.transformers_class,
                    "config_class": family.config_class, "config": family.config,
                    "dir": str(path), "inputs": inputs, "types": family.types,
                    "seed": family.seed})  # fmt: skip
    (root / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    subprocess.run(
        [python, str(SCRIPT), str(root / "job.json"), str(root / "logits.json")],
        check=True, env=env, timeout=600, capture_output=True,
    )  # fmt: skip
    logits = json.loads((root / "logits.json").read_text())
    for family in families:
        out = built[family.name]
        out.logits = np.array(logits[family.name], np.float64)[:, 0]
        shutil.copy(TOKENIZERS / family.tokenizer / "tokenizer.json", out.path)
        if family.published is not None:
            _as_published(out.path, family)
    return built


def _as_published(path: Path, family: ClassifierFamily) -> None:
    """The checkpoint as the remote code ships it: its config and its base model's prefix."""
    assert family.prefix is not None and family.published is not None
    old, new = family.prefix
    weights = load_file(str(path / "model.safetensors"))
    save_file(
        {new + k.removeprefix(old) if k.startswith(old) else k: v for k, v in weights.items()},
        str(path / "model.safetensors"),
    )
    (path / "config.json").write_text(json.dumps(family.published))
