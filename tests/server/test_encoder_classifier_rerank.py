"""Every family's cross-encoder head through serve's ``/v1/rerank`` and ``/v1/score`` (one pool,
serve's starter, the encoder engine's packed passes), against transformers' own
``*ForSequenceClassification`` logits on the same weights (``encoder_classifiers.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from macbatch.engine import Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import ModelPool, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.encoder_classifiers import (
    FAMILIES,
    BuiltClassifier,
    build_classifiers,
    torch_python,
)
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app

pytestmark = pytest.mark.skipif(torch_python() is None, reason="no Python with torch")
QUERY = "how are blocks freed"
DOCUMENTS = [
    "blocks go back when a request ends",
    "the weather is nice",
    "a",
    "the scheduler preempts a request when blocks run short " * 8,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Served, dict[str, BuiltClassifier]]]:
    built = build_classifiers(tmp_path_factory.mktemp("rerankers"), [(QUERY, d) for d in DOCUMENTS])
    catalog = [Servable(name, str(b.path), b.path) for name, b in built.items()]
    pool = ModelPool(catalog, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits())
    first = FAMILIES[0].name
    pool.load_now(first)
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), pool.loaded[first].thread) as s:
            yield s, built
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_rerank_and_score_equal_transformers(served, name: str) -> None:
    server, built = served
    want = 1 / (1 + np.exp(-built[name].logits))
    body = {"model": name, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    ranked = httpx.post(server.api + "/rerank", json=body, timeout=120).json()["results"]
    assert [r["index"] for r in ranked] == list(np.argsort(want)[::-1][:3])
    for r in ranked:
        assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-4 * want[r["index"]]
    body = {"model": name, "text_1": QUERY, "text_2": DOCUMENTS}
    scores = httpx.post(server.api + "/score", json=body, timeout=120).json()["data"]
    np.testing.assert_allclose([s["score"] for s in scores], want, rtol=1e-4)
    card = next(c for c in httpx.get(server.api + "/models").json()["data"] if c["id"] == name)
    assert card["macbatch"]["tasks"] == ["score", "rerank"]
