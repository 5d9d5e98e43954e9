"""The classification heads of DistilBERT, MPNet, ELECTRA, DeBERTa-v2, ModernBERT (CLS and mean
pooling), gte and Nomic BERT against transformers' own ``*ForSequenceClassification`` logits on
the same random weights (``tests/support/encoder_classifiers.py``): long-tailed pairs scored in
packed passes through the Python API, the task list, a missing head weight refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from macbatch.engine.encoder.facts import encoder_facts
from macbatch.engine.encoder.model import EncoderModel
from tests.support.encoder_checkpoints import long_tailed_texts
from tests.support.encoder_classifiers import (
    FAMILIES,
    BuiltClassifier,
    build_classifiers,
    torch_python,
)

pytestmark = pytest.mark.skipif(torch_python() is None, reason="no Python with torch")
QUERY = "how are blocks freed when a request ends"
# past ModernBERT's local band (8 positions either way) and DeBERTa's exact buckets (16)
DOCUMENTS = [*long_tailed_texts(15, seed=7), "the engine packs every request into one step " * 24]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuiltClassifier]:
    pairs = [(QUERY, doc) for doc in DOCUMENTS]
    return build_classifiers(tmp_path_factory.mktemp("classifiers"), pairs)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-logits))


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_scores_equal_transformers(built: dict[str, BuiltClassifier], name: str) -> None:
    checkpoint = built[name]
    model = EncoderModel.load(str(checkpoint.path))
    pairs = [model.tokenize_pair(QUERY, doc) for doc in DOCUMENTS]
    assert [list(p.ids) for p in pairs] == [ids for ids, _ in checkpoint.inputs]
    assert max(len(p.ids) for p in pairs) > 150
    got = model.score(pairs, max_batch_tokens=300)  # several pairs a pass, several passes
    want = sigmoid(checkpoint.logits)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert np.ptp(checkpoint.logits) > 0.05  # the logits differ enough for that to mean much
    assert encoder_facts(checkpoint.path).tasks == ["score", "rerank"]  # type: ignore[union-attr]


def test_a_missing_head_weight_is_refused_by_name(built, tmp_path: Path) -> None:
    source = built["distilbert"].path
    path = tmp_path / "headless"
    path.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (path / name).write_text((source / name).read_text())
    weights = load_file(str(source / "model.safetensors"))
    del weights["pre_classifier.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="classifier.dense.weight"):
        EncoderModel.load(str(path))
