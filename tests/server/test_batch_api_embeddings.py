"""Embedding batches through the Batch API with the official openai client, over a tiny
embedding checkpoint with the real Qwen3 tokenizer: each output line's body is what
``/v1/embeddings`` answers for the same body, and its vectors equal a direct forward of the same
weights (tests/support/pooling_oracle.py); rows that cannot run are lines of the error file."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import output_lines, run_batch
from tests.support.live_server import Served, serving, start_engine
from tests.support.pooling_oracle import cosine, direct_pooled
from tests.support.real_tokenizers import load_real_tokenizer
from tests.support.sentence_transformers import write_sentence_transformers
from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

URL = "/v1/embeddings"
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog " * 5, "MLX on a Mac"]
GOOD = {
    "one": {"input": "hello world"},
    "many": {"input": TEXTS},  # three engine requests, one line
    "ids": {"input": [[9707, 1879], [5]], "encoding_format": "base64"},
    "cut": {"input": "MLX on a Mac", "dimensions": 16},
}
BAD = {
    "empty": {"input": ""},
    "long": {"input": ["fine", [5] * 5000]},  # its first request is queued, then withdrawn
    "prompt": {"input": "x", "prompt_name": "passage"},
}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Any]]:
    """A mean-pooling embedding checkpoint served with a data directory (the Batch API on)."""
    import mlx_lm

    path = save_model_with_tokenizer(
        tmp_path_factory.mktemp("models") / "tiny-embedding", "qwen3", QWEN3_VOCAB
    )
    write_sentence_transformers(path, ("mean_tokens",))
    thread = start_engine(path)
    options = ServerOptions(data_dir=tmp_path_factory.mktemp("data"))
    with serving(thread, options) as server:
        yield server, mlx_lm.load(str(path))[0]
        stop_batches(server.app)
    thread.shutdown()


def _vectors(body: dict[str, Any]) -> list[np.ndarray]:
    return [
        np.frombuffer(base64.b64decode(e), "<f4") if isinstance(e, str) else np.asarray(e)
        for e in (item["embedding"] for item in body["data"])
    ]


def _ids(value: Any) -> list[int]:
    return value if isinstance(value, list) else load_real_tokenizer("qwen3").encode(value)


def test_embedding_batch(embedder: tuple[Served, Any], tmp_path: Path) -> None:
    server, model = embedder
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    batch = run_batch(client, URL, {**GOOD, **BAD})
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 7, "completed": 4, "failed": 3}
    lines = {line["custom_id"]: line for line in output_lines(client, batch.output_file_id)}
    assert sorted(lines) == sorted(GOOD)
    for name, body in GOOD.items():
        got = lines[name]["response"]["body"]
        live = httpx.post(server.api + "/embeddings", json=body, timeout=60).json()
        assert {k: v for k, v in got.items() if k != "data"} == {
            k: v for k, v in live.items() if k != "data"
        }
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        for text, vector, served in zip(inputs, _vectors(got), _vectors(live), strict=True):
            expected = direct_pooled(model, _ids(text), "mean", True, body.get("dimensions"))
            assert vector.shape == expected.shape == served.shape
            assert cosine(vector, expected) >= 0.99999 and cosine(vector, served) >= 0.99999
            assert abs(np.linalg.norm(vector) - 1.0) <= 1e-4
    errors = {line["custom_id"]: line for line in output_lines(client, batch.error_file_id)}
    assert sorted(errors) == sorted(BAD)
    for line in errors.values():
        assert line["response"] is None and line["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200
