"""`task: embed` and `task: rerank` jobs on encoder models (``load_engine`` picks their engine):
an embedding job writes every row's float32 vector once, equal to the float64 numpy oracle,
with BGE-M3's sparse weights in its result lines, and a rerun rebuilds the identical matrix; a
rerank job on a cross-encoder (BERT's head, and DeBERTa-v2's of the heads built since) scores
each pair as the oracle does. (Resuming after kill -9 is the runner's, whichever engine:
tests/batch/test_embed_jobs.py kills a child run; a child process here would cost its ~10 s of
imports for nothing the encoder changes.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tests.support.encoder_checkpoints import long_tailed_texts, write_encoder, write_m3_heads
from tests.support.encoder_head_checkpoints import HEAD_FAMILIES, write_head_checkpoint
from tests.support.encoder_oracle import (
    cosines,
    oracle_embedding,
    oracle_hidden,
    oracle_lexical,
    oracle_score,
)
from tests.support.job_files import read_jsonl, write_job
from tests.support.sentence_transformers import write_sentence_transformers

ROWS = 200
XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def test_embed_job_equals_the_oracle(tmp_path: Path, macbatch_run) -> None:
    model, weights, config = write_encoder(tmp_path / "e5-small", "xlm-roberta")
    write_sentence_transformers(model, ("mean_tokens",), normalize=True, prompts={"p": "p: "})
    sparse, _ = write_m3_heads(model)
    texts = long_tailed_texts(ROWS, seed=7)
    with (tmp_path / "docs.jsonl").open("w") as f:
        f.writelines(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    job_file = write_job(
        tmp_path,
        f"""
        model: {model}
        jobs:
          - name: docs
            task: embed
            input: docs.jsonl
            template: "{{text}}"
            embedding: {{prompt_name: p, return_sparse: true}}
            vectors: out/docs.npy
        """,
    )
    out = tmp_path / "out"
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(out / "docs.jsonl")}
    assert Counter(x["custom_id"] for x in read_jsonl(out / "docs.jsonl")) == {
        f"d{i}": 1 for i in range(ROWS)
    }
    matrix = np.load(out / "docs.npy")
    ids = json.loads((out / "docs.ids.json").read_text())
    assert matrix.shape == (ROWS, 64) and matrix.dtype == np.float32
    assert ids == [[f"d{i}", 0] for i in range(ROWS)]
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.enable_truncation(512)
    special = {tokenizer.token_to_id(t) for t in XLMR_SPECIALS}
    for i in range(0, ROWS, 37):
        token_ids = tokenizer.encode("p: " + texts[i]).ids
        want = oracle_embedding(weights, config, token_ids, "mean", True)
        assert cosines(matrix[i], want) >= 0.99999
        item = lines[f"d{i}"]["response"]["body"]["data"][0]
        hidden = oracle_hidden(weights, config, token_ids, [0] * len(token_ids))
        lexical = oracle_lexical(hidden, token_ids, sparse, special)
        assert {int(k) for k in item["lexical_weights"]} == lexical.keys()
    assert json.loads((out / "summary.json").read_text())["jobs"]["docs"]["vectors_rows"] == ROWS
    first = (out / "docs.npy").read_bytes()
    assert macbatch_run(job_file).exit_code == 0  # nothing left to do: the same file
    assert (out / "docs.npy").read_bytes() == first


def test_rerank_job_on_a_cross_encoder(tmp_path: Path, macbatch_run) -> None:
    model, weights, config = write_encoder(tmp_path / "ms-marco-MiniLM", "bert", classifier=True)
    query = "how are blocks freed"
    documents = long_tailed_texts(8, seed=3)
    rows = [{"id": f"p{i}", "query": query, "document": d} for i, d in enumerate(documents)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job_file = write_job(
        tmp_path,
        f"""
        model: {model}
        jobs:
          - name: pairs
            task: rerank
            input: pairs.jsonl
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "pairs.jsonl")}
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.enable_truncation(512)
    for i, document in enumerate(documents):
        pair = tokenizer.encode(query, document)
        score = lines[f"p{i}"]["response"]["body"]["data"][0]["score"]
        assert abs(score - oracle_score(weights, config, pair.ids, pair.type_ids)) <= 1e-5


def test_rerank_job_on_a_deberta_classifier(tmp_path: Path, macbatch_run) -> None:
    """A head beyond BERT's through ``run``: DeBERTa-v2's ContextPooler with the activation its
    config names, each pair's score the numpy oracle's sigmoid of its logit."""
    family = next(f for f in HEAD_FAMILIES if f.name == "deberta-v2")
    checkpoint = write_head_checkpoint(tmp_path / "deberta-reranker", family)
    query = "how are blocks freed"
    documents = long_tailed_texts(6, seed=5)
    rows = [{"id": f"p{i}", "query": query, "document": d} for i, d in enumerate(documents)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job_file = write_job(
        tmp_path,
        f"""
        model: {checkpoint.path}
        jobs:
          - name: pairs
            task: rerank
            input: pairs.jsonl
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "pairs.jsonl")}
    logits = checkpoint.logits([(query, d) for d in documents])
    got = [lines[f"p{i}"]["response"]["body"]["data"][0]["score"] for i in range(len(documents))]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits)), rtol=1e-4)
