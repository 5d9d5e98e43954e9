"""image_url parts in the request layer: data URLs, file:// paths, several per message, kept in
order beside the text; bad input is a 400 naming the part."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from macbatch.engine.multimodal.images import MAX_PIXELS, images_of
from macbatch.openai import ImageAccess, InvalidRequest, parse_chat
from tests.support.tiny_vlm import png_bytes

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")
PILImage = pytest.importorskip("PIL.Image")
# files anywhere and loopback fetches: what a test's own files and servers need (the rules
# themselves: tests/openai/test_image_access.py)
OPEN = ImageAccess(remote=True, private=True, local_dirs=None)


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def messages_of(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "look:"}, *parts]}]


def test_data_and_file_images_are_read_in_order(tmp_path: Path) -> None:
    first, second = png_bytes(20, 10, 1), png_bytes(30, 40, 2)
    path = tmp_path / "second.png"
    path.write_bytes(second)
    parts = image_part(data_url(first)), image_part(path.as_uri())
    [prompt] = parse_chat({"messages": messages_of(*parts)}, images=OPEN).prompts
    images = images_of(prompt)
    assert [i.data for i in images] == [first, second]
    assert [(i.width, i.height) for i in images] == [(20, 10), (30, 40)]
    content = prompt[0]["content"]
    assert [p["type"] for p in content] == ["text", "image", "image"]


def _bad(url: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": messages_of(image_part(url))}, images=OPEN)
    assert info.value.param == "messages[0].content[1]"
    assert str(info.value).startswith("messages[0].content[1]")
    return info.value


def test_not_an_image_is_a_400_naming_the_part() -> None:
    assert "not a readable image" in str(_bad(data_url(b"hello, not a picture")))


def test_a_truncated_png_is_a_400() -> None:
    data = png_bytes(64, 64, 5)
    assert "not a readable image" in str(_bad(data_url(data[: len(data) // 2])))


def test_an_image_over_the_pixel_cap_is_a_400() -> None:
    side = int(MAX_PIXELS**0.5) + 100  # a 1-bit image: small in memory and on disk
    out = io.BytesIO()
    PILImage.new("1", (side, side)).save(out, format="PNG")
    assert "megapixels" in str(_bad(data_url(out.getvalue())))


def test_bad_urls_are_400s(tmp_path: Path) -> None:
    assert "no image file" in str(_bad((tmp_path / "missing.png").as_uri()))
    assert "base64" in str(_bad("data:image/png;base64,@@@"))
    assert "must be a data: URL" in str(_bad("ftp://example.com/a.png"))


def test_an_unreachable_url_is_a_400() -> None:
    # port 9 on loopback: nothing listens, the connection is refused at once (no network)
    assert "could not fetch" in str(_bad("http://127.0.0.1:9/a.png"))


def test_an_image_served_over_http_is_read(tmp_path: Path) -> None:
    import http.server
    import threading
    from functools import partial

    (tmp_path / "photo.png").write_bytes(png_bytes(24, 24, 7))
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/photo.png"
        [prompt] = parse_chat({"messages": messages_of(image_part(url))}, images=OPEN).prompts
    finally:
        server.shutdown()
        server.server_close()
    [image] = images_of(prompt)
    assert image.data == (tmp_path / "photo.png").read_bytes()
