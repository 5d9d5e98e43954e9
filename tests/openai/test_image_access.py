"""Where a request's images may come from (issue 46): no file:// read outside the directories
allowed, no fetch unless allowed, never to loopback or private addresses unless allowed, one
error for every failed fetch (no port scanner), one DNS lookup per hop (no rebinding), redirects
checked, and a model that takes no images refusing every part before anything is read.
Every server here is a 127.0.0.1 one the test starts and stops."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from macbatch.openai import ImageAccess, InvalidRequest, image_fetch, parse_chat

pytest.importorskip("PIL.Image")  # load_image decodes with Pillow (the vision extra)

from tests.support.image_site import site  # noqa: E402
from tests.support.tiny_vlm import png_bytes  # noqa: E402

PNG = png_bytes(8, 8, 1)
ROUTES = {"/a.png": (200, {}, PNG), "/text": (200, {}, b"hello")}
LOOPBACK_OK = ImageAccess(remote=True, private=True, timeout_s=3.0)


def _parse(url: str, access: ImageAccess) -> list:
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {"messages": [{"role": "user", "content": [part]}]}
    [prompt] = parse_chat(body, images=access).prompts
    return prompt


def _refusal(url: str, access: ImageAccess) -> str:
    with pytest.raises(InvalidRequest) as info:
        _parse(url, access)
    assert info.value.param == "messages[0].content[0]"
    return str(info.value)


def test_file_urls_are_read_only_under_allowed_directories(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (outside / "b.png").write_bytes(PNG)
    (allowed / "link.png").symlink_to(outside / "b.png")
    access = ImageAccess(local_dirs=(allowed,))
    assert _parse((allowed / "a.png").as_uri(), access)[0]["content"][0]["type"] == "image"
    # outside: the same words whether the file exists or not (no "does it exist" oracle)
    refusals = {
        _refusal(url, access).replace(url, "URL")
        for url in (
            "file:///etc/passwd",
            (outside / "b.png").as_uri(),
            (outside / "missing.png").as_uri(),
            (allowed / "link.png").as_uri(),  # a link inside pointing out
            (allowed / ".." / "outside" / "b.png").as_uri(),
        )
    }
    assert len(refusals) == 1
    assert "--allow-local-images" in refusals.pop()
    # by default (a front end that says nothing) no path is read at all
    assert "--allow-local-images" in _refusal((allowed / "a.png").as_uri(), ImageAccess())


def test_no_fetch_unless_remote_images_are_allowed() -> None:
    with site(ROUTES) as served:
        message = _refusal(served.base + "/a.png", ImageAccess())
        assert served.hits == 0
    assert "does not fetch image URLs" in message


def test_loopback_and_private_addresses_are_never_fetched_unless_allowed() -> None:
    public_only = ImageAccess(remote=True, timeout_s=3.0)
    with site(ROUTES) as served:
        for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
            url = f"http://{host}:{served.port}/a.png"
            assert _refusal(url, public_only).endswith(f"could not fetch the image at {url}")
        assert served.hits == 0
        assert _parse(served.base + "/a.png", LOOPBACK_OK)  # allowed: read
        assert served.hits == 1
    for address in ("10.0.0.1", "169.254.169.254", "192.168.1.1", "::1", "fe80::1", "0.0.0.0"):
        assert not image_fetch._public(image_fetch.ipaddress.ip_address(address))


def test_every_failed_fetch_reads_the_same() -> None:
    """A closed port, a 404, a 500, a redirect loop and a server that never answers: one message
    (the URL aside), so a client learns nothing of what is behind a URL."""
    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    quick = ImageAccess(remote=True, private=True, timeout_s=1.0)
    try:
        routes = {"/500": (500, {}, b"x"), "/loop": (302, {"Location": "/loop"}, b"")}
        with site(routes) as served:
            urls = [
                f"http://127.0.0.1:{closed.getsockname()[1]}/a.png",
                served.base + "/missing.png",
                served.base + "/500",
                served.base + "/loop",
                f"http://127.0.0.1:{silent.getsockname()[1]}/a.png",
                "http://no-such-host.invalid/a.png",
            ]
            messages = {_refusal(url, quick).replace(url, "URL") for url in urls}
    finally:
        silent.close()
        closed.close()
    assert messages == {"messages[0].content[0]: could not fetch the image at URL"}


def test_bad_bytes_of_an_allowed_fetch_say_so() -> None:
    with site(ROUTES) as served:
        assert "not a readable image" in _refusal(served.base + "/text", LOOPBACK_OK)


def test_a_redirect_to_a_refused_address_is_not_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first hop is allowed (as a public host would be), its redirect target is checked
    again and refused: the second server is never reached."""
    checked: list[str] = []
    real = image_fetch._checked_address

    def first_hop_only(host: str, port: int, private: bool) -> str:
        checked.append(f"{host}:{port}")
        return real(host, port, private or len(checked) == 1)

    monkeypatch.setattr(image_fetch, "_checked_address", first_hop_only)
    with site(ROUTES) as inner:
        target = {"/go": (302, {"Location": inner.base + "/a.png"}, b"")}
        with site(target) as outer:
            access = ImageAccess(remote=True, timeout_s=3.0)
            assert "could not fetch" in _refusal(outer.base + "/go", access)
            assert outer.hits == 1
        assert inner.hits == 0
    assert len(checked) == 2


def test_the_host_is_resolved_once_and_the_checked_address_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No second lookup between the check and the connection (DNS rebinding): the name
    resolves once, to the address then connected, and the request still names the host."""
    lookups: list[str] = []
    real = socket.getaddrinfo

    def fake(host: str, port: object, *args: object, **kwargs: object) -> list:
        if host == "images.test":
            lookups.append(host)
            address = "127.0.0.1" if len(lookups) == 1 else "192.0.2.1"  # a rebinding answer
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with site(ROUTES) as served:
        assert _parse(f"http://images.test:{served.port}/a.png", LOOPBACK_OK)
        assert served.hosts == [f"images.test:{served.port}"]
    assert lookups == ["images.test"]


def test_a_model_that_takes_no_images_refuses_before_reading(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    access = ImageAccess(
        refused="it has no vision tower", remote=True, private=True, local_dirs=None
    )
    with site(ROUTES) as served:
        for url in (served.base + "/a.png", (tmp_path / "a.png").as_uri(), "file:///etc/passwd"):
            assert "takes no images" in _refusal(url, access)
        assert served.hits == 0
