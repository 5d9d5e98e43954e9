"""A model the engine cannot read is refused with the reason in every front end, never a crash:
a tiny checkpoint of a deliberately odd architecture (``tests/support/odd_model.py``: its
attention calls a method of mlx-lm's cache that the engine's paged cache lacks) asked of serve
(a 400 naming the model and why, the other model still serving), run (the job stops before any
row, saying why) and doctor (``tests/engine/model/test_odd_layers.py``; chat in
``tests/tui/test_odd_model_refused.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from macbatch.engine import Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import ModelPool, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.job_files import write_job
from tests.support.live_server import ENGINE_CONFIG, serving_app
from tests.support.odd_model import ODD_TYPE, save_odd_model
from tests.support.tiny import save_model

# what the refusal says, wherever it is shown
WHY = f"model type '{ODD_TYPE}': its forward failed on the engine's paged cache"


def test_serve_answers_400_naming_the_model_and_why(tmp_path: Path) -> None:
    good, odd = save_model(tmp_path / "alpha"), save_odd_model(tmp_path / "odd")
    catalog = [Servable("alpha", str(good), good), Servable("odd", str(odd), odd)]
    pool = ModelPool(
        catalog, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits(keep_alive_s=None)
    )
    pool.load_now("alpha")
    hi = [{"role": "user", "content": "hi"}]
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), pool.loaded["alpha"].thread) as s:
            client = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0)
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="odd", messages=hi)
            assert refused.value.body["code"] == "model_unavailable"
            message = refused.value.body["message"]
            assert "cannot load model 'odd'" in message and WHY in message
            assert "is_trimmable" in message
            reply = client.chat.completions.create(model="alpha", messages=hi, max_tokens=3)
            assert reply.choices[0].finish_reason == "length"
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def test_run_stops_before_any_row_saying_why(tmp_path: Path, macbatch_run: Any) -> None:
    odd = save_odd_model(tmp_path / "odd")
    job = write_job(
        tmp_path,
        f"""
        model: {odd}
        defaults:
          chat: false
          sampling: {{temperature: 0, max_tokens: 3}}
        jobs:
          - name: a
            prompts: ["hello world"]
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 1
    assert f"cannot load model '{odd}'" in result.stderr and WHY in result.stderr
    assert "Traceback" not in result.output + result.stderr
