"""Chat on a model the engine cannot read (``tests/support/odd_model.py``): the loading panel
shows the refusal with its reason, and the app keeps running (serve, run and doctor:
``tests/test_odd_model_refused.py``)."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig
from macbatch.tui.widgets.loading_panel import LoadingPanel
from tests.support.chat_app import wait_for
from tests.support.odd_model import ODD_TYPE, save_odd_model


async def test_the_refusal_is_shown_with_its_reason(make_app, tmp_path):
    odd = save_odd_model(tmp_path / "odd")
    app = make_app(loader=lambda: Engine.load(str(odd), EngineConfig(num_blocks=16)))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.load_error is not None)
        panel = app.screen.query_one(LoadingPanel)
        await wait_for(pilot, lambda: panel.has_class("-failed"), timeout=10)
        shown = str(panel.query_one(".phase").render())
        assert f"model type '{ODD_TYPE}'" in shown and "is_trimmable" in shown
