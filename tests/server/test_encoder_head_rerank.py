"""A family's own cross-encoder head through serve's ``/v1/rerank`` and ``/v1/score`` (one pool,
serve's starter, the encoder engine's packed passes): ModernBERT's mean-pooled head with a dense
bias and SiLU from its config, against the float64 numpy oracle on a checkpoint written with
numpy (``encoder_head_checkpoints.py``). No torch: CI's (``test_encoder_classifier_rerank.py``
serves every family against transformers' classes where a Python with torch is)."""

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
from tests.support.encoder_checkpoints import long_tailed_texts
from tests.support.encoder_head_checkpoints import HEAD_FAMILIES, write_head_checkpoint
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app

NAME = "modernbert-mean"
QUERY = "how are blocks freed"
DOCUMENTS = [*long_tailed_texts(5, seed=3), "a", "the scheduler preempts a request " * 30]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Served, np.ndarray]]:
    family = next(f for f in HEAD_FAMILIES if f.name == NAME)
    checkpoint = write_head_checkpoint(tmp_path_factory.mktemp("reranker") / NAME, family)
    logits = checkpoint.logits([(QUERY, d) for d in DOCUMENTS])
    catalog = [Servable(NAME, str(checkpoint.path), checkpoint.path)]
    pool = ModelPool(catalog, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits())
    pool.load_now(NAME)
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), pool.loaded[NAME].thread) as s:
            yield s, 1 / (1 + np.exp(-logits))
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def test_rerank_and_score_equal_the_numpy_oracle(served) -> None:
    server, want = served
    assert np.ptp(want) > 0.01
    body = {"model": NAME, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    ranked = httpx.post(server.api + "/rerank", json=body, timeout=120).json()["results"]
    assert [r["index"] for r in ranked] == list(np.argsort(want)[::-1][:3])
    for r in ranked:
        assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-4 * want[r["index"]]
    body = {"model": NAME, "text_1": QUERY, "text_2": DOCUMENTS}
    scores = httpx.post(server.api + "/score", json=body, timeout=120).json()["data"]
    np.testing.assert_allclose([s["score"] for s in scores], want, rtol=1e-4)
    card = next(c for c in httpx.get(server.api + "/models").json()["data"] if c["id"] == NAME)
    assert card["macbatch"]["tasks"] == ["score", "rerank"]
