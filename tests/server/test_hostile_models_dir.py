"""A ``--models-dir`` that others fill (issue 61, items 6 and 9): one folder whose config.json is
not JSON, or not an object, is listed with its problem while the others are listed and served
(``GET /v1/models``, ``macbatch models``); a folder named to inject lines into ``/metrics``
(a quote, a backslash, line feeds and a sample) is served, and the exposition stays valid (read
by a strict grammar of the format, and prometheus_client's parser where installed), its label
reading back as the folder's name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine import Turns
from macbatch.models.catalog import catalog, starter
from macbatch.models.pool import ModelPool, PoolLimits
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.exposition import parse_exposition
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app
from tests.support.tiny import save_model

INJECTED = 'q"uo\\te\nmacbatch_injected_total 1\n#'


@pytest.fixture(scope="module")
def shelf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-shelf")
    save_model(root / "given", arch="qwen3", seed=0)
    folder = root / "shelf"
    (folder / "broken").mkdir(parents=True)
    (folder / "broken" / "config.json").write_text("{")
    (folder / "listed").mkdir()
    (folder / "listed" / "config.json").write_text("[1]")
    save_model(folder / INJECTED, arch="llama", seed=1)
    save_model(folder / "fine", arch="qwen3", seed=2)
    return root


@pytest.fixture(scope="module")
def served(shelf: Path) -> Iterator[Served]:
    entries = catalog((str(shelf / "given"),), (shelf / "shelf",))
    pool = ModelPool(entries, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits())
    loaded = pool.load_now(entries[0].name)
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), loaded.thread) as server:
            yield server
    finally:
        for model in list(pool.loaded.values()):
            model.thread.shutdown()


def test_v1_models_lists_every_folder_despite_a_bad_config(served: Served) -> None:
    response = httpx.get(served.api + "/models")
    assert response.status_code == 200, response.text
    ids = [card["id"] for card in response.json()["data"]]
    assert {"broken", "listed", "fine", INJECTED} <= set(ids)


def test_macbatch_models_lists_a_bad_config_with_its_problem(shelf: Path) -> None:
    done = CliRunner().invoke(app, ["models", "--json", "--models-dir", str(shelf / "shelf")])
    assert done.exit_code == 0, done.output
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["fine"]["supported"] and rows["fine"]["architecture"] == "qwen3"
    broken, listed = rows["broken"], rows["listed"]
    assert not broken["supported"] and "config.json cannot be read as JSON" in broken["problem"]
    assert not listed["supported"] and "config.json is not a JSON object" in listed["problem"]
    table = CliRunner().invoke(app, ["models", "--models-dir", str(shelf / "shelf")])
    assert table.exit_code == 0 and "fix or remove it" in table.output


def test_a_model_name_cannot_inject_lines_into_metrics(served: Served) -> None:
    client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
    for model in (INJECTED, "fine"):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.choices[0].message.content is not None
    page = httpx.get(served.url + "/metrics")
    samples = parse_exposition(page.text)  # every line valid
    assert not [s for s in samples if s.name == "macbatch_injected_total"]
    named = {s.labels.get("model") for s in samples if s.name == "macbatch_requests_total"}
    assert {INJECTED, "fine"} <= named
