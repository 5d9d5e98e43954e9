"""The rotary encoder families (gte, Nomic BERT, ModernBERT) and DeBERTa-v2 packed in MLX
against the float64 numpy oracle on the same HF-layout weights: every row of a long-tailed
batch over several passes, and the published switches the encoder does not run refused by
name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from macbatch.engine.encoder.model import EncoderModel
from tests.support.encoder_checkpoints import long_tailed_texts
from tests.support.encoder_families import (
    deberta_config,
    gte_config,
    modernbert_config,
    nomic_config,
    write_family,
)
from tests.support.encoder_family_oracle import family_hidden
from tests.support.encoder_oracle import cosines, oracle_pooled
from tests.support.sentence_transformers import write_sentence_transformers

CASES = {
    "gte-en-ntk": (gte_config(), "cls_token"),
    "gte-multilingual": (gte_config(multilingual=True), "cls_token"),
    "nomic": (nomic_config(), "mean_tokens"),
    "modernbert-mlm": (modernbert_config(), "mean_tokens"),
    "modernbert-biases": (modernbert_config(biases=True, masked_lm=False), "cls_token"),
    "deberta-v3": (deberta_config(), "mean_tokens"),
    "deberta-v2-branches": (deberta_config(v3=False), "cls_token"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_rows_equal_the_oracle(tmp_path: Path, case: str) -> None:
    config, mode = CASES[case]
    path, weights, config = write_family(tmp_path / case, config)
    write_sentence_transformers(path, (mode,), prompts={})
    model = EncoderModel.load(str(path))
    inputs = [model.tokenize(t) for t in long_tailed_texts(40, seed=2)]
    lengths = [len(i.ids) for i in inputs]
    # long-tailed, several passes, and far past ModernBERT's 8-position local window
    assert max(lengths) > 4 * int(np.median(lengths)) and sum(lengths) > 3 * 600
    assert max(lengths) > 300
    got = model.embed(inputs, max_batch_tokens=600)
    want = np.stack([
        oracle_pooled(family_hidden(weights, config, list(i.ids), list(i.types)),
                      model.profile.pooling, model.profile.normalize)
        for i in inputs
    ])  # fmt: skip
    assert cosines(got, want).min() >= 0.99999
    np.testing.assert_allclose(
        np.linalg.norm(got, axis=-1), np.linalg.norm(want, axis=-1), rtol=1e-4
    )


_OLD_FIELDS = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")


def test_modernbert_config_as_transformers_5_writes_it(tmp_path: Path) -> None:
    """``layer_types`` and ``rope_parameters`` in place of the published fields: the same
    layers and bases."""
    path, weights, config = write_family(tmp_path / "mb", modernbert_config())
    kinds = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip
    written = {k: v for k, v in config.items() if k not in _OLD_FIELDS}
    (path / "config.json").write_text(
        json.dumps(written | {"layer_types": kinds, "rope_parameters": rope})
    )
    model = EncoderModel.load(str(path))
    longest = max(
        (model.tokenize(t) for t in long_tailed_texts(8, seed=12)), key=lambda i: len(i.ids)
    )
    assert len(longest.ids) > 40  # the local layers' band matters
    got, _ = model.hidden_states([longest])
    want = family_hidden(weights, config, list(longest.ids), list(longest.types))
    assert cosines(np.array(got), want).min() >= 0.99999


def test_nomic_pairs_carry_their_token_types(tmp_path: Path) -> None:
    """Nomic BERT keeps BERT's two token types: a pair's second text reads the second row."""
    path, weights, config = write_family(tmp_path / "nomic", nomic_config())
    model = EncoderModel.load(str(path))
    pair = model.tokenize_pair("how are blocks freed", "the scheduler frees them at the end")
    assert pair.types[0] == 0 and pair.types[-1] == 1
    hidden, _ = model.hidden_states([pair])
    want = family_hidden(weights, config, list(pair.ids), list(pair.types))
    assert cosines(np.array(hidden), want).min() >= 0.99999


@pytest.mark.parametrize(
    ("config", "field"),
    [(gte_config() | {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
     (gte_config() | {"position_embedding_type": "absolute"}, "position_embedding_type"),
     (nomic_config() | {"prenorm": True}, "prenorm"),
     (nomic_config() | {"rotary_emb_fraction": 0.5}, "rotary_emb_fraction"),
     (nomic_config() | {"moe_every_n_layers": 2}, "moe_every_n_layers"),
     (modernbert_config() | {"architectures": ["ModernBertForSequenceClassification"],
                             "classifier_pooling": "max"}, "classifier_pooling"),
     (modernbert_config() | {"rope_parameters": {"full_attention": {"rope_type": "yarn"}}},
      "rope_type"),
     (modernbert_config() | {"layer_types": ["full_attention"]}, "layer_types"),
     (deberta_config() | {"conv_kernel_size": 3}, "conv_kernel_size"),
     (deberta_config() | {"relative_attention": False}, "relative_attention")],
)  # fmt: skip
def test_a_variant_not_built_is_refused_by_name(tmp_path: Path, config: dict, field: str) -> None:
    path, _, _ = write_family(tmp_path / "variant", config)
    with pytest.raises(ValueError, match=field):
        EncoderModel.load(str(path))


def test_a_checkpoint_missing_a_weight_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path, _, _ = write_family(tmp_path / "gte", gte_config())
    weights = load_file(str(path / "model.safetensors"))
    del weights["encoder.layer.1.mlp_ln.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="layers.1.out_norm"):
        EncoderModel.load(str(path))


def test_models_show_a_rotary_encoders_pooling_and_length(tmp_path: Path) -> None:
    from macbatch.models.local import encoder_summary, tasks_of

    path, _, _ = write_family(tmp_path / "nomic-embed", nomic_config())
    write_sentence_transformers(path, ("mean_tokens",), prompts={"query": "search_query: "})
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))
    assert tasks_of(path) == ["embed", "score"]
    assert encoder_summary(path) == "mean pooling, 64 dimensions, normalized, 8192 tokens"


def test_modernbert_through_the_encoder_engine(tmp_path: Path) -> None:
    """``load_engine`` serves a ModernBERT checkpoint: long-tailed requests with mixed pooling
    packed into shared passes, each equal to the oracle."""
    from macbatch.engine import EngineConfig, EngineThread, PoolingParams, PromptInput, load_engine

    path, weights, config = write_family(tmp_path / "gte-modernbert", modernbert_config())
    write_sentence_transformers(path, ("cls_token",), prompts={})
    thread = EngineThread(
        lambda: load_engine(str(path), EngineConfig(max_num_batched_tokens=400))
    ).start()
    thread.wait_ready(120)
    texts = long_tailed_texts(16, seed=6)
    params = [PoolingParams(method="mean") if i % 2 else PoolingParams() for i in range(16)]

    async def run() -> list:
        requests = [thread.prepare(PromptInput(t), p) for t, p in zip(texts, params)]
        outputs: list = [None] * len(requests)
        async for index, out in thread.stream_prepared(requests):
            outputs[index] = out
        return outputs

    try:
        before = thread.stats().steps
        outputs = asyncio.run(run())
        assert 2 <= thread.stats().steps - before < len(texts)  # passes shared by requests
        for text, p, out in zip(texts, params, outputs):
            ids = thread.encode_prompt(text)
            hidden = family_hidden(weights, config, ids, [0] * len(ids))
            want = oracle_pooled(hidden, p.method or "cls", True)
            assert cosines(out.embedding, want) >= 0.99999
    finally:
        thread.shutdown()
