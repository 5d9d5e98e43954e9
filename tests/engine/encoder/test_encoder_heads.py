"""The classification heads of DistilBERT, MPNet, ELECTRA, DeBERTa-v2, ModernBERT (CLS and mean
pooling), gte and Nomic BERT against the float64 numpy oracle (each family's numpy encoder,
then its head as transformers defines it: ``encoder_head_oracle.py``), on checkpoints written
with numpy (``encoder_head_checkpoints.py``): long-tailed pairs scored in packed passes through
the Python API; a missing head weight refused. No torch: CI's check of the heads
(``test_encoder_classifiers.py`` is the second oracle, transformers' own classes, where a
Python with torch is)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from macbatch.engine.encoder.facts import encoder_facts
from macbatch.engine.encoder.model import EncoderModel
from tests.support.encoder_checkpoints import long_tailed_texts
from tests.support.encoder_head_checkpoints import HEAD_FAMILIES, write_head_checkpoint

QUERY = "how are blocks freed when a request ends"
# past ModernBERT's local band (8 positions either way) and DeBERTa's exact buckets (16)
DOCUMENTS = [*long_tailed_texts(15, seed=7), "the engine packs every request into one step " * 24]


@pytest.mark.parametrize("family", HEAD_FAMILIES, ids=lambda f: f.name)
def test_scores_equal_the_numpy_oracle(tmp_path: Path, family) -> None:
    checkpoint = write_head_checkpoint(tmp_path / family.name, family)
    model = EncoderModel.load(str(checkpoint.path))
    pairs = [model.tokenize_pair(QUERY, doc) for doc in DOCUMENTS]
    assert max(len(p.ids) for p in pairs) > 150
    got = model.score(pairs, max_batch_tokens=300)  # several pairs a pass, several passes
    logits = checkpoint.logits([(QUERY, doc) for doc in DOCUMENTS])
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits)), rtol=1e-4)
    assert np.ptp(logits) > 0.05  # the logits differ enough for that to mean much
    assert encoder_facts(checkpoint.path).tasks == ["score", "rerank"]  # type: ignore[union-attr]


def test_a_missing_head_weight_is_refused_by_name(tmp_path: Path) -> None:
    checkpoint = write_head_checkpoint(tmp_path / "headless", HEAD_FAMILIES[0])
    weights = load_file(str(checkpoint.path / "model.safetensors"))
    del weights["pre_classifier.weight"]
    save_file(weights, str(checkpoint.path / "model.safetensors"))
    with pytest.raises(ValueError, match="classifier.dense.weight"):
        EncoderModel.load(str(checkpoint.path))
