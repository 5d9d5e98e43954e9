"""`task: embed` and `task: rerank` jobs: vectors against a direct forward of the same model, a
2,000-row embedding job killed with kill -9 twice and resumed writes the same matrix as an
uninterrupted run (every row once), OpenAI-batch embedding rows, and job-file refusals."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import mlx_lm
import numpy as np
import pytest

from macbatch.engine.pooling.embedding_profile import RerankFormat
from tests.support.batch_process import start_run, wait_for_lines
from tests.support.job_files import JOBS, read_jsonl, write_job
from tests.support.pooling_oracle import cosine, direct_pooled, direct_yes_probability
from tests.support.real_tokenizers import load_real_tokenizer
from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

ROWS = 2000  # the check names 20,000; 2,000 keep this test under a minute on CI


def _embed_job(directory: Path, model: Path, rows: int = ROWS) -> Path:
    with (directory / "docs.jsonl").open("w") as f:
        for i in range(rows):
            words = " ".join(["fox", "dog", "MLX", "batch"][: 1 + i % 4] * (1 + i % 7))
            f.write(json.dumps({"id": f"d{i}", "text": f"document {i}: {words}"}) + "\n")
    return write_job(
        directory,
        f"""
        model: {model}
        jobs:
          - name: docs
            task: embed
            input: docs.jsonl
            template: "{{text}}"
            embedding: {{pooling: mean, dimensions: 48}}
            vectors: out/docs.npy
        """,
    )


def _vectors(out: Path) -> tuple[np.ndarray, list]:
    return np.load(out / "docs.npy"), json.loads((out / "docs.ids.json").read_text())


def test_killed_twice_and_resumed_gives_the_uninterrupted_matrix(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    reference = _embed_job(tmp_path / "whole", tiny_model_path)
    result = macbatch_run(reference)
    assert result.exit_code == 0, result.output
    expected, expected_ids = _vectors(tmp_path / "whole" / "out")

    job_file = _embed_job(tmp_path / "killed", tiny_model_path)
    out = tmp_path / "killed" / "out"
    for lines in (300, 1100):
        process = start_run(job_file, in_flight=64)
        wait_for_lines(out / "docs.jsonl", process, lines)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert lines <= len((out / "docs.jsonl").read_bytes().splitlines()) < ROWS
    before = {x["custom_id"]: x for x in read_jsonl(out / "docs.jsonl")}
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = read_jsonl(out / "docs.jsonl")
    assert Counter(x["custom_id"] for x in lines) == {f"d{i}": 1 for i in range(ROWS)}
    matrix, ids = _vectors(out)
    assert matrix.shape == (ROWS, 48) and matrix.dtype == np.float32
    assert ids == expected_ids == [[f"d{i}", 0] for i in range(ROWS)]
    # rows finished before the kills are kept as written, never recomputed
    for custom_id, line in before.items():
        row = int(custom_id[1:])
        written = line["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_array_equal(matrix[row], np.asarray(written, dtype=np.float32))
    # the same vectors as the uninterrupted run, up to the order of float sums in steps that
    # packed other rows together (bit-for-bit only where the step's batch was the same)
    np.testing.assert_allclose(matrix, expected, rtol=0, atol=2e-6)
    assert min(cosine(a, b) for a, b in zip(matrix, expected)) >= 0.99999
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] >= 1100 and summary["jobs"]["docs"]["vectors_rows"] == ROWS
    # a rerun with nothing left to do rebuilds the identical file
    first = (out / "docs.npy").read_bytes()
    assert macbatch_run(job_file).exit_code == 0
    assert (out / "docs.npy").read_bytes() == first

    model, tokenizer = mlx_lm.load(str(tiny_model_path))
    texts = (tmp_path / "whole" / "docs.jsonl").read_text().splitlines()
    for i in (0, 5, 1234, ROWS - 1):
        ids_i = tokenizer.encode(json.loads(texts[i])["text"])
        oracle = direct_pooled(model, ids_i, "mean", True, 48)
        assert cosine(matrix[i], oracle) >= 0.99999
        assert abs(np.linalg.norm(matrix[i]) - 1.0) <= 1e-4


def test_openai_batch_embedding_rows(tmp_path: Path, tiny_model_path: Path, macbatch_run) -> None:
    """Rows for /v1/embeddings (a list of inputs, base64, token ids) beside a chat row: each
    line holds the response serve would send; the matrix has one row per input, in order."""
    model, tokenizer = mlx_lm.load(str(tiny_model_path))
    ids = tokenizer.encode("token ids in")
    rows = [
        {"custom_id": "a", "url": "/v1/embeddings", "body": {"input": ["one", "two words"]}},
        {"custom_id": "b", "url": "/v1/embeddings",
         "body": {"input": ids, "encoding_format": "base64"}},
        {"custom_id": "c", "url": "/v1/embeddings", "body": {"input": ""}},
        # its second input is too long: the first, queued already, is aborted with the row
        {"custom_id": "d", "url": "/v1/embeddings", "body": {"input": ["fine", [5] * 5000]}},
    ]  # fmt: skip
    (tmp_path / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: docs
            task: embed
            input: batch.jsonl
            vectors: out/docs.npy
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 3, result.output  # rows c and d failed
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "docs.jsonl")}
    body = lines["a"]["response"]["body"]
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    count = len(tokenizer.encode("one")) + len(tokenizer.encode("two words"))
    assert body["usage"]["prompt_tokens"] == count == lines["a"]["macbatch"]["prompt_tokens"]
    encoded = lines["b"]["response"]["body"]["data"][0]["embedding"]
    vector_b = np.frombuffer(base64.b64decode(encoded), "<f4")
    matrix, order = _vectors(tmp_path / "out")
    assert order == [["a", 0], ["a", 1], ["b", 0]]
    for row, prompt in zip(matrix, [tokenizer.encode("one"), tokenizer.encode("two words"), ids]):
        assert cosine(row, direct_pooled(model, prompt, "last")) >= 0.99999
    np.testing.assert_array_equal(matrix[2], vector_b)
    empty, long = read_jsonl(tmp_path / "out" / "docs.errors.jsonl")
    assert empty["custom_id"] == "c" and "empty string" in empty["error"]["message"]
    assert long["custom_id"] == "d" and "5000 tokens" in long["error"]["message"]
    assert sorted(lines) == ["a", "b"]


def test_rerank_job_on_a_reranker(tmp_path: Path, macbatch_run) -> None:
    path = save_model_with_tokenizer(tmp_path / "tiny-Qwen3-Reranker", "qwen3", QWEN3_VOCAB)
    pairs = [("what is MLX?", d) for d in ("an array framework", "a fox", "Apple silicon")]
    rows = [{"id": f"p{i}", "query": q, "document": d} for i, (q, d) in enumerate(pairs)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job_file = write_job(
        tmp_path,
        f"""
        model: {path}
        jobs:
          - name: pairs
            task: rerank
            input: pairs.jsonl
            instruction: Judge relevance
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "pairs.jsonl")}
    model = mlx_lm.load(str(path))[0]
    tokenizer = load_real_tokenizer("qwen3")
    yes, no = tokenizer._tokenizer.convert_tokens_to_ids(["yes", "no"])
    for i, (query, document) in enumerate(pairs):
        prompt = RerankFormat(yes, no).prompt_ids(tokenizer, query, document, "Judge relevance")
        score = lines[f"p{i}"]["response"]["body"]["data"][0]["score"]
        assert abs(score - direct_yes_probability(model, prompt, yes, no)) <= 1e-4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"task": "classify"}, "task must be one of generate, embed, rerank"),
        ({"vectors": "out/x.npy"}, "'vectors' is the matrix of a task: embed job"),
        ({"task": "embed", "vectors": "out/x.csv"}, "must name a .npy or .safetensors file"),
        ({"task": "embed", "embedding": {"dimension": 8}}, "did you mean 'dimensions'"),
        ({"task": "embed", "embedding": {"pooling": "max"}}, "'pooling' must be one of"),
        ({"task": "embed", "n": 2}, "'score', 'n' and reply formats are for generation"),
    ],
)
def test_job_file_refusals(tmp_path: Path, tiny_model_path: Path, macbatch_run, settings, message):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "x"}\n')
    job = {"name": "docs", "input": "rows.jsonl", **settings}
    job_file = write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{json.dumps(job)}]\n")
    result = macbatch_run(job_file)
    assert result.exit_code == 1 and message in result.output, result.output


def test_shipped_embed_job_runs_offline_on_the_demo_model(tmp_path: Path, macbatch_run) -> None:
    """jobs/embed.yaml as shipped (a copy beside copies of its data), on the packaged model."""
    shutil.copy(JOBS / "embed.yaml", tmp_path / "embed.yaml")
    shutil.copytree(JOBS / "data", tmp_path / "data")
    result = macbatch_run(tmp_path / "embed.yaml")
    assert result.exit_code == 0, result.output
    questions = read_jsonl(JOBS / "data" / "demo_questions.jsonl")
    matrix = np.load(tmp_path / "out" / "questions.npy")
    order = json.loads((tmp_path / "out" / "questions.ids.json").read_text())
    assert matrix.shape == (len(questions), 64)
    assert order == [[q["id"], 0] for q in questions]
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    scores = [
        x["response"]["body"]["data"][0]["score"]
        for x in read_jsonl(tmp_path / "out" / "relevance.jsonl")
    ]
    assert len(scores) == 100 and all(-1.0 <= s <= 1.0 for s in scores)


def test_vectors_as_safetensors(tmp_path: Path, tiny_model_path: Path, macbatch_run) -> None:
    from safetensors.numpy import load_file

    job_file = _embed_job(tmp_path, tiny_model_path, rows=5)
    job_file.write_text(job_file.read_text().replace("out/docs.npy", "out/docs.safetensors"))
    assert macbatch_run(job_file).exit_code == 0
    matrix = load_file(tmp_path / "out" / "docs.safetensors")["vectors"]
    lines = sorted(read_jsonl(tmp_path / "out" / "docs.jsonl"), key=lambda x: x["macbatch"]["line"])
    expected = [x["response"]["body"]["data"][0]["embedding"] for x in lines]
    np.testing.assert_array_equal(matrix, np.asarray(expected, dtype=np.float32))
    assert json.loads((tmp_path / "out" / "docs.ids.json").read_text())[4] == ["d4", 0]
