"""/v1/embeddings, /v1/rerank and /v1/score on a real server over tiny random models with the
real Qwen3 tokenizer: vectors and scores against a direct forward of the same weights (the
official openai client for embeddings), and the 400s."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from macbatch.engine.pooling.embedding_profile import RerankFormat
from tests.support.live_server import Served, serving, start_engine
from tests.support.metrics_scrape import scrape
from tests.support.pooling_oracle import cosine, direct_pooled, direct_yes_probability
from tests.support.real_tokenizers import load_real_tokenizer
from tests.support.sentence_transformers import QWEN3_QUERY_PROMPT, write_sentence_transformers
from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog " * 5, "MLX on a Mac"]
DOCUMENTS = [
    "macbatch batches many prompts at once on Apple silicon.",
    "The weather is nice today.",
    "Paged attention keeps the KV cache in blocks.",
    "a",
]


def _serve(path) -> Iterator[tuple[Served, object]]:
    import mlx_lm

    oracle = mlx_lm.load(str(path))[0]
    thread = start_engine(path)
    with serving(thread) as server:
        yield server, oracle
    thread.shutdown()


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """A Qwen3-Embedding-like checkpoint: mean pooling (to tell it from the default), prompts."""
    path = save_model_with_tokenizer(
        tmp_path_factory.mktemp("models") / "tiny-embedding", "qwen3", QWEN3_VOCAB
    )
    write_sentence_transformers(path, ("mean_tokens",))
    yield from _serve(path)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = save_model_with_tokenizer(
        tmp_path_factory.mktemp("models") / "tiny-Qwen3-Reranker", "qwen3", QWEN3_VOCAB
    )
    yield from _serve(path)


def _ids(text: str) -> list[int]:
    return load_real_tokenizer("qwen3").encode(text)


def _assert_vector(got, model, ids, method="mean", dimensions=None) -> None:
    expected = direct_pooled(model, ids, method, True, dimensions)
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == expected.shape
    assert cosine(got, expected) >= 0.99999
    assert abs(np.linalg.norm(got) - 1.0) <= 1e-4


def test_openai_client_embeddings(embedder) -> None:
    server, model = embedder
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    response = client.embeddings.create(model=server.thread.info.model_name, input=TEXTS)
    assert [d.index for d in response.data] == [0, 1, 2]
    for text, item in zip(TEXTS, response.data):
        _assert_vector(item.embedding, model, _ids(text))
    tokens = sum(len(_ids(t)) for t in TEXTS)
    assert response.usage.prompt_tokens == tokens == response.usage.total_tokens
    cut = client.embeddings.create(
        model=server.thread.info.model_name, input="hello world", dimensions=16,
        encoding_format="float",
    )  # fmt: skip
    _assert_vector(cut.data[0].embedding, model, _ids("hello world"), dimensions=16)


def test_token_ids_base64_and_prompt_name(embedder) -> None:
    server, model = embedder
    ids = [_ids(t) for t in TEXTS]
    body = {"input": ids, "encoding_format": "base64"}
    data = httpx.post(server.api + "/embeddings", json=body, timeout=60).json()["data"]
    for item, row in zip(data, ids):
        _assert_vector(np.frombuffer(base64.b64decode(item["embedding"]), "<f4"), model, row)
    single = httpx.post(server.api + "/embeddings", json={"input": ids[0]}, timeout=60).json()
    _assert_vector(single["data"][0]["embedding"], model, ids[0])
    body = {"input": "what is MLX?", "prompt_name": "query"}
    query = httpx.post(server.api + "/embeddings", json=body, timeout=60).json()
    _assert_vector(query["data"][0]["embedding"], model, _ids(QWEN3_QUERY_PROMPT + "what is MLX?"))


def test_models_list_says_it_embeds(embedder, reranker) -> None:
    card = httpx.get(embedder[0].api + "/models").json()["data"][0]["macbatch"]
    assert card["tasks"] == ["generate", "embed", "score"]
    assert card["embedding"]["pooling"] == "mean" and card["embedding"]["dimensions"] == 64
    assert card["embedding"]["embedding_model"] and card["embedding"]["prompts"] == [
        "document",
        "query",
    ]
    rerank = httpx.get(reranker[0].api + "/models").json()["data"][0]["macbatch"]
    assert "rerank" in rerank["tasks"] and not rerank["embedding"]["embedding_model"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": 5}, "input"),
        ({"input": []}, "input"),
        ({"input": [[1, 2], "x", [True]]}, "input[2]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 65}, "dimensions"),
        ({"input": "x", "pooling": "max"}, "pooling"),
        ({"input": "x", "prompt_name": "passage"}, "prompt_name"),
        ({"input": [[5] * 5000]}, "input"),
    ],
)
def test_bad_embedding_bodies(embedder, body, param) -> None:
    response = httpx.post(embedder[0].api + "/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


def test_truncation_embeds_the_first_tokens(embedder) -> None:
    server, model = embedder
    ids = [5 + i % 300 for i in range(5000)]
    body = {"input": [ids], "truncate": True}
    response = httpx.post(server.api + "/embeddings", json=body, timeout=120).json()
    limit = server.thread.info.context_limit
    assert response["usage"]["prompt_tokens"] == limit
    _assert_vector(response["data"][0]["embedding"], model, ids[:limit])


def test_rerank_matches_the_models_yes_no_logits(reranker) -> None:
    server, model = reranker
    tokenizer = load_real_tokenizer("qwen3")
    fmt = RerankFormat(*tokenizer._tokenizer.convert_tokens_to_ids(["yes", "no"]))
    query = "how does macbatch batch prompts?"
    expected = [
        direct_yes_probability(model, fmt.prompt_ids(tokenizer, query, d), fmt.yes, fmt.no)
        for d in DOCUMENTS
    ]
    body = {"query": query, "documents": DOCUMENTS, "top_n": 3}
    response = httpx.post(server.api + "/rerank", json=body, timeout=60).json()
    results = response["results"]
    assert [r["index"] for r in results] == list(np.argsort(expected)[::-1][:3])
    for r in results:
        assert abs(r["relevance_score"] - expected[r["index"]]) <= 1e-4
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    body = {
        "query": query,
        "documents": [{"text": d} for d in DOCUMENTS],
        "return_documents": False,
    }
    whole = httpx.post(server.api + "/rerank", json=body, timeout=60).json()["results"]
    assert len(whole) == 4 and all("document" not in r for r in whole)
    body = {"text_1": query, "text_2": DOCUMENTS}
    scores = httpx.post(server.api + "/score", json=body, timeout=60).json()["data"]
    np.testing.assert_allclose([s["score"] for s in scores], expected, atol=1e-4)


def test_score_by_cosine_on_an_embedding_model(embedder) -> None:
    server, model = embedder
    body = {"text_1": ["hello world", "MLX on a Mac"], "text_2": ["hello there", "MLX"]}
    data = httpx.post(server.api + "/score", json=body, timeout=60).json()["data"]
    for item, first, second in zip(data, body["text_1"], body["text_2"]):
        a = direct_pooled(model, _ids(first), "mean")
        b = direct_pooled(model, _ids(second), "mean")
        assert abs(item["score"] - float(a @ b)) <= 1e-4


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/rerank", {"query": "q", "documents": ["d"]}, "model"),  # not a reranker
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
        ("/score", {"text_1": "a", "text_2": [""]}, "text_2[0]"),
    ],
)
def test_bad_scoring_bodies(embedder, path, body, param) -> None:
    response = httpx.post(embedder[0].api + path, json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"documents": ["d"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": [{"txt": "d"}]}, "documents[0]"),
        ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ],
)
def test_bad_rerank_bodies(reranker, body, param) -> None:
    response = httpx.post(reranker[0].api + "/rerank", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_metrics_count_embedded_tokens(embedder) -> None:
    server, _ = embedder
    before = scrape(server)["macbatch_prompt_tokens_total"]
    body = {"input": TEXTS}
    usage = httpx.post(server.api + "/embeddings", json=body, timeout=60).json()["usage"]
    after = scrape(server)
    assert after["macbatch_prompt_tokens_total"] - before == usage["prompt_tokens"]
    assert after['macbatch_requests_total{finish_reason="stop"}'] >= len(TEXTS)
