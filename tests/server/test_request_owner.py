"""A client gone at any stage of a served request leaves nothing held: not its model's lease,
not an admission slot, not an engine request (``generation.ServedRequest`` owns all three and
closes them once, however the request ends)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from macbatch.engine import EngineThread, Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import ModelPool, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from macbatch.server.serving import ServerState
from tests.support.live_server import ENGINE_CONFIG, Served, serving_app
from tests.support.polling import wait_until

MODEL = "tiny"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "tell me a long story"}],
    "temperature": 0,
    "ignore_eos": True,
}


class GatedStarter:
    """serve's starter, holding each load until the test opens the gate."""

    def __init__(self) -> None:
        self.start = starter(ENGINE_CONFIG, Turns())
        self.gate = threading.Event()

    def __call__(self, entry: Servable) -> EngineThread:
        assert self.gate.wait(120), "the test never let the model load"
        return self.start(entry)


@pytest.fixture(scope="module")
def server(tiny_model_path: Path) -> Iterator[tuple[Served, ModelPool, GatedStarter]]:
    """A pool server whose one model loads on demand, when the gate opens."""
    gated = GatedStarter()
    catalog = [Servable(MODEL, str(tiny_model_path), tiny_model_path)]
    pool = ModelPool(catalog, gated, DATA_ONLY, PoolLimits(keep_alive_s=None))
    app = create_pool_app(pool, ServerOptions())
    try:
        with serving_app(app, cast(EngineThread, None)) as served:
            yield served, pool, gated
    finally:
        gated.gate.set()
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def held(served: Served, pool: ModelPool) -> dict[str, Any]:
    """What the server still holds: leases, admission slots, engine requests and KV blocks."""
    state: ServerState = served.app.state.macbatch
    loaded = pool.loaded.get(MODEL)
    engine = (False, 0)
    if loaded is not None:
        call = loaded.thread.call(lambda e: (e.has_unfinished(), e.stats().kv_blocks_used))
        engine = call.result(timeout=30)
    return {
        "leases": 0 if loaded is None else loaded.leases,
        "slots": state.admission.pending,
        "model_slots": state.admission.pending_of(MODEL),
        "engine_requests": engine[0],
        "kv_blocks": engine[1],
    }


NOTHING = {"leases": 0, "slots": 0, "model_slots": 0, "engine_requests": False, "kv_blocks": 0}


def assert_nothing_held(served: Served, pool: ModelPool) -> None:
    assert wait_until(lambda: held(served, pool) == NOTHING, timeout=10), held(served, pool)


def test_a_client_gone_at_every_stage_leaves_nothing_held(
    server: tuple[Served, ModelPool, GatedStarter],
) -> None:
    served, pool, gated = server
    url = served.api + "/chat/completions"

    # before admission: the body half sent
    body = json.dumps({**CHAT, "max_tokens": 8, "stream": True}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[: len(body) // 2])
    assert_nothing_held(served, pool)

    # while the model loads: a stream and a whole answer, both gone before it is loaded
    for stream in (True, False):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={**CHAT, "max_tokens": 2000, "stream": stream}, timeout=0.5)
    assert MODEL not in pool.loaded
    gated.gate.set()
    assert wait_until(lambda: MODEL in pool.loaded, timeout=120)
    assert_nothing_held(served, pool)

    # mid-stream
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json={**CHAT, "max_tokens": 2000, "stream": True}) as r,
    ):
        lines = r.iter_lines()  # held: dropping it would close the connection here
        received = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(received) >= 3
        assert held(served, pool)["leases"] == 1
    assert_nothing_held(served, pool)

    # after the last token: the finish chunk read, the usage chunk and [DONE] not
    options = {"stream_options": {"include_usage": True}, "n": 2}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json={**CHAT, "max_tokens": 4, "stream": True, **options}) as r,
    ):
        finished, lines = 0, r.iter_lines()
        for line in lines:
            if line.startswith("data:") and '"finish_reason":"' in line:
                finished += 1
                if finished == 2:
                    break
        assert finished == 2
    assert_nothing_held(served, pool)

    # and the server still serves
    reply = httpx.post(url, json={**CHAT, "max_tokens": 4}, timeout=30)
    assert reply.status_code == 200
    assert_nothing_held(served, pool)
