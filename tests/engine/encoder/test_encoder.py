"""The packed MLX encoder against the float64 numpy oracle on the same HF-layout weights: every
row of a long-tailed batch, each pooling, prompts, max_seq_length, and cross-encoder scores."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from macbatch.engine.encoder.model import EncoderModel
from tests.support.encoder_checkpoints import (
    distilbert_checkpoint,
    electra_checkpoint,
    long_tailed_texts,
    mpnet_checkpoint,
    write_encoder,
    write_m3_heads,
)
from tests.support.encoder_oracle import (
    cosines,
    oracle_colbert,
    oracle_hidden,
    oracle_lexical,
    oracle_pooled,
    oracle_score,
)
from tests.support.sentence_transformers import write_sentence_transformers


def oracle_vectors(model: EncoderModel, weights: dict, config: dict, inputs: list) -> np.ndarray:
    return np.stack(
        [
            oracle_pooled(
                oracle_hidden(weights, config, list(i.ids), list(i.types)),
                model.profile.pooling,
                model.profile.normalize,
            )
            for i in inputs
        ]
    )


@pytest.mark.parametrize(
    ("model_type", "prefixed", "mode"),
    [("bert", True, "cls_token"), ("bert", False, "mean_tokens"),
     ("xlm-roberta", False, "mean_tokens"), ("xlm-roberta", True, "cls_token"),
     ("roberta", False, "lasttoken")],
)  # fmt: skip
def test_packed_rows_equal_the_oracle(
    tmp_path: Path, model_type: str, prefixed: bool, mode: str
) -> None:
    path, weights, config = write_encoder(tmp_path / "enc", model_type, prefixed=prefixed)
    write_sentence_transformers(path, (mode,), normalize=mode != "lasttoken", prompts={})
    model = EncoderModel.load(str(path))
    inputs = [model.tokenize(t) for t in long_tailed_texts(40)]
    lengths = [len(i.ids) for i in inputs]
    # long-tailed (the words come from docs/, so exact lengths move with them), several passes
    assert max(lengths) > 4 * int(np.median(lengths)) and sum(lengths) > 3 * 600
    got = model.embed(inputs, max_batch_tokens=600)
    want = oracle_vectors(model, weights, config, inputs)
    assert cosines(got, want).min() >= 0.99999
    np.testing.assert_allclose(
        np.linalg.norm(got, axis=-1), np.linalg.norm(want, axis=-1), rtol=1e-4
    )
    first = inputs[0].ids
    if model_type == "bert":
        assert first[0] == model.tokenizer.token_to_id("[CLS]")
    else:
        assert first[0] == model.tokenizer.token_to_id("<s>")
        assert first[-1] == model.tokenizer.token_to_id("</s>")


def test_distilbert_equals_bert_without_token_types(tmp_path: Path) -> None:
    """DistilBERT is BERT's block without token types under its own names: the oracle runs the
    same weights under BERT's names with a zero token-type row."""
    path, weights, config = distilbert_checkpoint(tmp_path / "distil")
    write_sentence_transformers(path, ("mean_tokens",), prompts={})
    model = EncoderModel.load(str(path))
    assert "token_type" not in model.model.embeddings
    inputs = [model.tokenize(t) for t in long_tailed_texts(16, seed=7)]
    got = model.embed(inputs, max_batch_tokens=400)
    assert cosines(got, oracle_vectors(model, weights, config, inputs)).min() >= 0.99999


@pytest.mark.parametrize("checkpoint", [mpnet_checkpoint, electra_checkpoint])
def test_mpnet_and_electra_equal_the_oracle(tmp_path: Path, checkpoint: Callable) -> None:
    """MPNet: BERT's block under its own names with a relative-position bias on every layer's
    scores; ELECTRA: BERT with narrower embeddings projected up. Both under a task prefix, with
    a head the encoder drops."""
    path, weights, config = checkpoint(tmp_path / "enc")
    write_sentence_transformers(path, ("mean_tokens",), prompts={})
    model = EncoderModel.load(str(path))
    inputs = [model.tokenize(t) for t in long_tailed_texts(24, seed=9)]
    # past the exact buckets (8) and the last logarithmic one (128)
    assert max(len(i.ids) for i in inputs) > 200
    got = model.embed(inputs, max_batch_tokens=500)
    assert cosines(got, oracle_vectors(model, weights, config, inputs)).min() >= 0.99999


def test_packing_does_not_change_a_row(tmp_path: Path) -> None:
    path, _, _ = write_encoder(tmp_path / "enc", "bert")
    model = EncoderModel.load(str(path))
    inputs = [model.tokenize(t) for t in long_tailed_texts(24, seed=3)]
    together = model.embed(inputs)
    alone = np.concatenate([model.embed([i]) for i in inputs])
    assert cosines(together, alone).min() >= 0.999999


def test_profile_prompts_max_seq_length_and_dimensions(tmp_path: Path) -> None:
    path, weights, config = write_encoder(tmp_path / "e5", "xlm-roberta")
    write_sentence_transformers(
        path, ("mean_tokens",), prompts={"query": "query: ", "passage": "passage: "}
    )
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    model = EncoderModel.load(str(path))
    assert (model.profile.pooling, model.profile.normalize, model.max_tokens) == ("mean", True, 32)
    query = model.tokenize("what is paging", prompt_name="query")
    assert query.ids == model.tokenize("query: what is paging").ids
    long = model.tokenize(" ".join(long_tailed_texts(30, seed=3)))
    assert len(long.ids) == 32 and long.ids[-1] == model.tokenizer.token_to_id("</s>")
    got = model.embed([query, long], dimensions=16)
    assert got.shape == (2, 16)
    means = [
        oracle_hidden(weights, config, list(i.ids), list(i.types)).mean(0)[:16]
        for i in (query, long)
    ]
    want = np.stack([m / np.linalg.norm(m) for m in means])
    assert cosines(got, want).min() >= 0.99999
    with pytest.raises(ValueError, match="prompt_name"):
        model.tokenize("x", prompt_name="nope")


def test_encoder_without_sentence_transformers_pools_cls(tmp_path: Path) -> None:
    path, _, _ = write_encoder(tmp_path / "plain", "bert")
    profile = EncoderModel.load(str(path)).profile
    assert (profile.pooling, profile.normalize) == ("cls", True)
    assert "encoder" in profile.source


@pytest.mark.parametrize("model_type", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_equal_the_oracle(tmp_path: Path, model_type: str) -> None:
    path, weights, config = write_encoder(tmp_path / "rerank", model_type, classifier=True)
    model = EncoderModel.load(str(path))
    docs = long_tailed_texts(12, seed=5)
    pairs = [model.tokenize_pair("how are blocks freed", d) for d in docs]
    if model_type == "bert":  # the document's tokens are segment 1
        assert pairs[0].types[-1] == 1 and pairs[0].types[0] == 0
    got = model.score(pairs, max_batch_tokens=300)
    want = [oracle_score(weights, config, list(p.ids), list(p.types)) for p in pairs]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert list(np.argsort(got)) == list(np.argsort(want))


def test_an_embedding_model_does_not_score(tmp_path: Path) -> None:
    path, _, _ = write_encoder(tmp_path / "enc", "bert")
    model = EncoderModel.load(str(path))
    with pytest.raises(ValueError, match="cross-encoder"):
        model.score([model.tokenize_pair("a", "b")])


def test_models_and_doctor_show_an_encoders_tasks_pooling_and_dimensions(tmp_path: Path) -> None:
    from macbatch.models.check import check_model
    from macbatch.models.local import encoder_summary, tasks_of

    path, _, _ = write_encoder(tmp_path / "bge-small", "bert")
    write_sentence_transformers(path, ("cls_token",), prompts={})
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    reranker, _, _ = write_encoder(tmp_path / "bge-reranker", "xlm-roberta", classifier=True)
    assert tasks_of(path) == ["embed", "score"]
    assert tasks_of(reranker) == ["score", "rerank"]
    assert encoder_summary(path) == "cls pooling, 64 dimensions, normalized, 256 tokens"
    rows = dict(check_model(str(path)).rows)
    assert rows["encoder"] == "embed,score: cls pooling, 64 dimensions, normalized, 256 tokens"
    report = check_model(str(reranker))
    assert dict(report.rows)["encoder"] == "score,rerank: cross-encoder (1 label), 512 tokens"
    assert report.problem is None  # served by its encoder engine


def test_bge_m3_sparse_and_colbert_outputs_equal_the_oracle(tmp_path: Path) -> None:
    path, weights, config = write_encoder(tmp_path / "bge-m3", "xlm-roberta")
    sparse, colbert = write_m3_heads(path)
    model = EncoderModel.load(str(path))
    inputs = [model.tokenize(t) for t in long_tailed_texts(12, seed=11)]
    lexical = model.lexical_weights(inputs, max_batch_tokens=300)
    vectors = model.colbert_vectors(inputs, max_batch_tokens=300)
    special = {model.tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<unk>", "<mask>")}
    assert special <= model.special_ids
    for item, got_weights, got_vectors in zip(inputs, lexical, vectors):
        hidden = oracle_hidden(weights, config, list(item.ids), list(item.types))
        want = oracle_lexical(hidden, list(item.ids), sparse, special)
        assert got_weights.keys() == want.keys() and not special & got_weights.keys()
        np.testing.assert_allclose([got_weights[k] for k in want], list(want.values()), atol=1e-4)
        assert got_vectors.shape == (len(item.ids) - 1, 64)  # CLS dropped
        assert cosines(got_vectors, oracle_colbert(hidden, colbert)).min() >= 0.99999


def test_a_torch_file_naming_other_globals_is_refused(tmp_path: Path) -> None:
    import pickle
    import zipfile

    from macbatch.engine.encoder.torch_file import read_torch_state_dict

    path = tmp_path / "sparse_linear.pt"
    with zipfile.ZipFile(path, "w") as archive:  # a pickle that would call os.getcwd
        archive.writestr("archive/data.pkl", b"cos\ngetcwd\n(tR.")
    with pytest.raises(pickle.UnpicklingError, match="os.getcwd"):
        read_torch_state_dict(path)
