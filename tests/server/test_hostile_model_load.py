"""Loading a hostile ``--models-dir`` model must not stall the model already serving (issue 61,
item 8): a config.json far larger than any model's, and configs declaring 12,000 or 10^9 layers
over weights for two, are refused from their files alone (the model is never built), with a short
error, while a request for the serving model completes during the refusal's checks (they hold
no turn of the device and run off the event loop); ``GET /v1/models/NAME`` of a model not
loaded reads its files off the event loop too."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import macbatch.engine.loader as loader
from macbatch.engine import Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import ModelPool, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app
from tests.support.tiny import save_model

HOSTILE = {
    "huge-config": {"padding": "x" * (9 * 2**20)},  # ~9 MiB: past any real config.json
    "layers-12000": {"num_hidden_layers": 12_000},
    "layers-1e9": {"num_hidden_layers": 10**9},
}
WAIT_S = 120  # only a failure waits this long


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-load")
    paths = {"serving": save_model(root / "serving", arch="qwen3", seed=0)}
    honest = save_model(root / "honest", arch="llama", seed=1)
    for name, change in HOSTILE.items():
        shutil.copytree(honest, root / "shelf" / name)
        config = json.loads((honest / "config.json").read_text())
        (root / "shelf" / name / "config.json").write_text(json.dumps({**config, **change}))
        paths[name] = root / "shelf" / name
    return paths


@pytest.fixture
def served(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    built: list[str] = []
    build = loader.load_checkpoint

    def recorded(path: Path, lazy: bool) -> Any:
        built.append(Path(path).name)
        return build(path, lazy)

    monkeypatch.setattr(loader, "load_checkpoint", recorded)
    catalog = [Servable(name, str(path), path) for name, path in models.items()]
    pool = ModelPool(catalog, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits())
    pool.load_now("serving")
    app = create_pool_app(pool, ServerOptions())
    try:
        with serving_app(app, pool.loaded["serving"].thread) as server:
            server.built = built  # type: ignore[attr-defined]
            yield server
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def chat(served: Served, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(served.api + "/chat/completions", json=body, timeout=WAIT_S)


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_model_is_refused_from_its_files_while_the_other_serves(
    served: Served, hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checking, answered = threading.Event(), threading.Event()
    read = loader.read_model_config

    def gated(path: Path) -> dict[str, Any]:
        """The hostile model's check waits, mid-check, for the serving model's answer: were the
        check holding the device or the event loop, that answer could never come."""
        if path.name == hostile:
            checking.set()
            assert answered.wait(WAIT_S), "the serving model's request waited for the check"
        return read(path)

    monkeypatch.setattr(loader, "read_model_config", gated)
    with ThreadPoolExecutor(1) as pool:
        refusal = pool.submit(chat, served, hostile)
        assert checking.wait(WAIT_S)
        assert chat(served, "serving").status_code == 200
        answered.set()
        response = refusal.result()
    assert response.status_code == 400
    assert len(response.content) < 2000  # not megabytes of the config echoed back
    message = response.json()["error"]["message"]
    assert f"cannot load model '{hostile}'" in message
    assert ("layers" if hostile.startswith("layers") else "bytes") in message
    assert hostile not in served.built  # type: ignore[attr-defined]
    assert chat(served, "serving").status_code == 200


def test_the_card_of_a_model_not_loaded_is_read_off_the_event_loop(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    loops: list[bool] = []
    import asyncio

    import macbatch.server.app as app_module

    card = app_module.model_card

    def recorded(models: Any, name: str) -> Any:
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        return card(models, name)

    monkeypatch.setattr(app_module, "model_card", recorded)
    assert httpx.get(served.api + "/models/layers-12000", timeout=WAIT_S).status_code == 200
    assert loops == [False]
