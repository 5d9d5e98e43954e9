"""serve's image rules end to end (issue 46): a model that takes no images answers every image
part with one 400 before anything is read or fetched (even where fetching and files are allowed),
and ``macbatch serve``'s flags decide fetching from the host it listens on."""

from __future__ import annotations

import plistlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from macbatch.openai import ImageAccess
from macbatch.server.command import serve_command
from macbatch.server.serving import ServerOptions
from tests.support.image_site import site
from tests.support.live_server import Served, serving, start_engine

EVERYTHING = ImageAccess(remote=True, private=True, local_dirs=None)


@pytest.fixture(scope="module")
def served(tiny_model_path: Path) -> Iterator[Served]:
    thread = start_engine(tiny_model_path)
    with serving(thread, ServerOptions(images=EVERYTHING)) as server:
        yield server
    thread.shutdown()


def test_a_text_model_refuses_image_parts_before_any_fetch(served: Served, tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"not read")
    with site({"/a.png": (200, {}, b"never fetched")}) as images:
        urls = [images.base + "/a.png", (tmp_path / "a.png").as_uri(), "file:///etc/passwd"]
        for url in urls:
            chat = {"type": "image_url", "image_url": {"url": url}}
            bodies = {
                "/v1/chat/completions": {"messages": [{"role": "user", "content": [chat]}]},
                "/v1/responses": {
                    "input": [
                        {"role": "user", "content": [{"type": "input_image", "image_url": url}]}
                    ]
                },
            }
            for path, body in bodies.items():
                reply = httpx.post(served.url + path, json=body, timeout=30)
                assert reply.status_code == 400, reply.text
                assert "takes no images" in reply.json()["error"]["message"], reply.text
        assert images.hits == 0


def _plist_options(args: list[str], tmp_path: Path) -> list[str]:
    app = typer.Typer()
    app.command()(serve_command)
    env = {"MACBATCH_HOME": str(tmp_path), "MACBATCH_API_KEY": ""}
    result = CliRunner().invoke(app, [*args, "--print-launchd-plist"], env=env)
    assert result.exit_code == 0, result.output
    return plistlib.loads(result.stdout.encode())["ProgramArguments"][2:]


def test_remote_images_default_by_host_and_flags_round_trip(tmp_path: Path) -> None:
    assert "--allow-remote-images" in _plist_options([], tmp_path)  # loopback: fetched
    reachable = _plist_options(["--host", "0.0.0.0", "--insecure"], tmp_path)
    assert "--no-remote-images" in reachable and "--allow-remote-images" not in reachable
    chosen = ["--host", "0.0.0.0", "--insecure", "--allow-remote-images"]
    assert "--allow-remote-images" in _plist_options(chosen, tmp_path)
    folder = tmp_path / "pictures"
    args = ["--allow-local-images", str(folder), "--allow-private-image-urls"]
    options = _plist_options(args, tmp_path)
    assert options[options.index("--allow-local-images") + 1] == str(folder.resolve())
    assert "--allow-private-image-urls" in options
