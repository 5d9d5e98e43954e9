"""Web pages against a keyless server (issue 46, item 9): a cross-site text/plain chat body or
multipart upload (the browser adds Origin), and DNS rebinding (Host: evil.example) are refused
with 403; OpenAI's client, same-origin pages and the allowed names and origins still work. Every
request goes to the 127.0.0.1 server the test starts; other names appear only as headers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions
from macbatch.server.origins import allowed_host_names, split_host
from tests.support.live_server import Served, serving

EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def keyless(
    engine_thread: EngineThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    options = ServerOptions(data_dir=tmp_path_factory.mktemp("serve"))
    with serving(engine_thread, options) as served:
        yield served


def _chat(served: Served) -> str:
    model = served.thread.info.model_name
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return json.dumps(body)


def _post_text_plain(served: Served, headers: dict[str, str]) -> httpx.Response:
    """The request a page can make with no preflight: a JSON body labelled text/plain."""
    headers = {"content-type": "text/plain", **headers}
    return httpx.post(served.api + "/chat/completions", content=_chat(served), headers=headers)


def _upload(served: Served, headers: dict[str, str]) -> httpx.Response:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    files = {"file": ("in.jsonl", json.dumps(line).encode() + b"\n")}
    return httpx.post(
        served.api + "/files", data={"purpose": "batch"}, files=files, headers=headers
    )


def test_the_openai_client_still_works(keyless: Served) -> None:
    client = openai.OpenAI(base_url=keyless.api, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=keyless.thread.info.model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
    )
    assert reply.choices[0].message.content is not None
    assert client.models.list().data


def test_a_cross_site_text_plain_chat_and_upload_are_refused(keyless: Served) -> None:
    chat = _post_text_plain(keyless, {"origin": EVIL})
    assert chat.status_code == 403, chat.text
    assert chat.json()["error"]["code"] == "origin_not_allowed"
    assert chat.json()["error"]["type"] == "permission_error"
    upload = _upload(keyless, {"origin": EVIL})
    assert upload.status_code == 403, upload.text
    assert httpx.get(keyless.url + "/health", headers={"origin": EVIL}).status_code == 403
    assert _post_text_plain(keyless, {"origin": "null"}).status_code == 403


def test_a_rebound_host_name_is_refused_on_every_path(keyless: Served) -> None:
    bad = {"host": "evil.example", "origin": EVIL}  # the page's own origin, after rebinding
    for response in (
        _post_text_plain(keyless, bad),
        _upload(keyless, bad),
        _post_text_plain(keyless, {"host": "evil.example"}),
        httpx.get(keyless.url + "/health", headers={"host": "evil.example:8000"}),
        httpx.get(keyless.api + "/models", headers={"host": "evil.example"}),
    ):
        assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "host_not_allowed"


def test_loopback_names_addresses_and_same_origin_pages_are_answered(keyless: Served) -> None:
    port = keyless.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
        assert httpx.get(keyless.url + "/health", headers={"host": host}).status_code == 200
    same = {"origin": f"http://127.0.0.1:{port}"}
    assert _post_text_plain(keyless, same).status_code == 200
    assert _upload(keyless, same).status_code == 200
    other_port = {"origin": "http://127.0.0.1:1"}  # another local service's page
    assert _post_text_plain(keyless, other_port).status_code == 403


def test_allowed_hosts_and_origins(engine_thread: EngineThread, tmp_path: Path) -> None:
    options = ServerOptions(
        allowed_hosts=("mac.lan",), allowed_origins=("http://app.example:3000/",)
    )
    with serving(engine_thread, options) as served:
        assert httpx.get(served.url + "/health", headers={"host": "mac.lan:80"}).status_code == 200
        assert _post_text_plain(served, {"origin": "http://app.example:3000"}).status_code == 200
        preflight = httpx.options(
            served.api + "/chat/completions",
            headers={
                "origin": "http://app.example:3000",
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, authorization",
            },
        )
        assert preflight.status_code == 200
        allowed = preflight.headers["access-control-allow-origin"]
        assert allowed == "http://app.example:3000"
        assert _post_text_plain(served, {"origin": EVIL}).status_code == 403
    with serving(engine_thread, ServerOptions(allowed_hosts=("*",))) as served:
        assert httpx.get(served.url + "/health", headers={"host": "any.name"}).status_code == 200


def test_names_allowed_by_the_bound_host() -> None:
    assert split_host("[::1]:8000") == ("::1", 8000)
    assert split_host("Mac.Local.:80") == ("mac.local", 80)
    loopback = allowed_host_names("127.0.0.1")
    assert loopback is not None and socket.gethostname().lower() not in loopback
    everywhere = allowed_host_names("0.0.0.0", ["extra.example:8000"])
    assert everywhere is not None
    assert {socket.gethostname().lower(), "extra.example", "localhost"} <= everywhere
    assert allowed_host_names("::1", ["*"]) is None
