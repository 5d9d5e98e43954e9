"""Encoder models through serve, in one pool beside a generation model (serve's starter, which
loads each through ``load_engine``): ``/v1/embeddings`` with the official ``openai`` client
(dense, base64, BGE-M3's sparse and ColBERT extension), ``/v1/rerank`` and ``/v1/score`` with an
XLM-RoBERTa cross-encoder, ``/v1/models`` with each model's tasks, all against the float64
numpy oracle; the decoder keeps generating and embedding; the 400s."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from macbatch.engine import Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import ModelPool, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.encoder_checkpoints import write_encoder, write_m3_heads
from tests.support.encoder_oracle import (
    cosines,
    oracle_colbert,
    oracle_embedding,
    oracle_hidden,
    oracle_lexical,
    oracle_score,
)
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app
from tests.support.sentence_transformers import write_sentence_transformers

TEXTS = ["paged attention keeps blocks", "a", "the engine packs every request " * 6]
QUERY = "how are blocks freed"
DOCUMENTS = ["blocks go back when a request ends", "the weather is nice", "a"]
XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_path: Path) -> Iterator[tuple[Served, dict]]:
    root = tmp_path_factory.mktemp("encoders")
    m3, m3_weights, m3_config = write_encoder(root / "bge-m3", "xlm-roberta")
    write_sentence_transformers(m3, ("cls_token",), normalize=True, prompts={"query": "q: "})
    heads = write_m3_heads(m3)
    reranker, rr_weights, rr_config = write_encoder(
        root / "bge-reranker", "xlm-roberta", classifier=True
    )
    catalog = [
        Servable("bge-m3", str(m3), m3),
        Servable("bge-reranker", str(reranker), reranker),
        Servable("tiny", str(tiny_model_path), tiny_model_path),
    ]
    pool = ModelPool(catalog, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits())
    pool.load_now("bge-m3")
    facts = {
        "m3": (m3_weights, m3_config, heads, Tokenizer.from_file(str(m3 / "tokenizer.json"))),
        "reranker": (rr_weights, rr_config, Tokenizer.from_file(str(reranker / "tokenizer.json"))),
    }
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), pool.loaded["bge-m3"].thread) as s:
            yield s, facts
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def _floats(value: str | list[float]) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), "<f4")
    return np.asarray(value, np.float32)


def _client(server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="x", max_retries=0, timeout=120)


def test_openai_client_embeddings_with_bge_m3_outputs(served) -> None:
    server, facts = served
    weights, config, (sparse, colbert), tokenizer = facts["m3"]
    special = {tokenizer.token_to_id(t) for t in XLMR_SPECIALS}
    response = _client(server).embeddings.create(
        model="bge-m3",
        input=TEXTS,
        extra_body={"return_sparse": True, "return_colbert_vecs": True, "prompt_name": "query"},
    )
    tokens = 0
    for text, item in zip(TEXTS, response.data):
        ids = tokenizer.encode("q: " + text).ids
        tokens += len(ids)
        want = oracle_embedding(weights, config, ids, "cls", True)
        assert cosines(np.asarray(item.embedding), want) >= 0.99999
        hidden = oracle_hidden(weights, config, ids, [0] * len(ids))
        lexical = {int(k): v for k, v in item.model_extra["lexical_weights"].items()}
        want_lexical = oracle_lexical(hidden, ids, sparse, special)
        assert lexical.keys() == want_lexical.keys()
        np.testing.assert_allclose(
            [lexical[k] for k in want_lexical], list(want_lexical.values()), atol=1e-4
        )
        # the client asks for base64 and decodes ``embedding`` only: the extension's vectors
        # come in the same encoding
        vectors = np.stack([_floats(v) for v in item.model_extra["colbert_vecs"]])
        assert cosines(vectors, oracle_colbert(hidden, colbert)).min() >= 0.99999
    assert response.usage.prompt_tokens == tokens
    packed = _client(server).embeddings.create(
        model="bge-m3", input=TEXTS[0], encoding_format="base64", dimensions=16
    )
    vector = _floats(packed.data[0].embedding)
    plain = tokenizer.encode(TEXTS[0]).ids  # no prompt named: the text alone
    assert vector.shape == (16,)
    assert cosines(vector, oracle_embedding(weights, config, plain, "cls", True, 16)) >= 0.99999


def test_cross_encoder_rerank_and_score(served) -> None:
    server, facts = served
    weights, config, tokenizer = facts["reranker"]
    want = [
        oracle_score(weights, config, enc.ids, enc.type_ids)
        for enc in (tokenizer.encode(QUERY, d) for d in DOCUMENTS)
    ]
    body = {"model": "bge-reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    ranked = httpx.post(server.api + "/rerank", json=body, timeout=120).json()["results"]
    assert [r["index"] for r in ranked] == list(np.argsort(want)[::-1][:2])
    for r in ranked:
        assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-5
    body = {"model": "bge-reranker", "text_1": QUERY, "text_2": DOCUMENTS}
    scores = httpx.post(server.api + "/score", json=body, timeout=120).json()["data"]
    np.testing.assert_allclose([s["score"] for s in scores], want, atol=1e-5)


def test_models_list_each_models_tasks_and_the_decoder_keeps_working(served) -> None:
    server, _ = served
    client = _client(server)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.usage.completion_tokens >= 1
    assert len(client.embeddings.create(model="tiny", input="hi").data[0].embedding) > 0
    httpx.post(server.api + "/score", json={"model": "bge-reranker", "text_1": "a", "text_2": "b"})
    cards = {c["id"]: c["macbatch"] for c in httpx.get(server.api + "/models").json()["data"]}
    assert cards["bge-m3"]["tasks"] == ["embed", "score"]
    assert cards["bge-m3"]["embedding"]["pooling"] == "cls"
    assert cards["bge-m3"]["embedding"]["dimensions"] == 64
    assert cards["bge-reranker"]["tasks"] == ["score", "rerank"]
    assert cards["tiny"]["tasks"][:3] == ["generate", "embed", "score"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/chat/completions", {"model": "bge-m3", "messages": [{"role": "user", "content": "x"}]},
         "is an encoder: it embeds and scores"),
        ("/embeddings", {"model": "bge-reranker", "input": "x"}, "is a cross-encoder"),
        ("/rerank", {"model": "bge-m3", "query": "x", "documents": ["y"]}, "is not a reranker"),
        ("/embeddings", {"model": "bge-reranker", "input": "x", "return_sparse": True},
         "is a cross-encoder"),
        ("/embeddings", {"model": "tiny", "input": "x", "return_sparse": True}, "BGE-M3's heads"),
    ],
)  # fmt: skip
def test_refusals_are_400s(served, path: str, body: dict, message: str) -> None:
    server, _ = served
    response = httpx.post(server.api + path, json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
