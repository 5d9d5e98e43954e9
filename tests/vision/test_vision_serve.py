"""serve: chat completions with image_url parts through the official openai client, against the
tiny VLM; the reply's ids are mlx-vlm's own greedy ones, and a bad image is a 400 naming the part
while the server keeps answering."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from macbatch.openai import ImageAccess
from macbatch.server.serving import ServerOptions
from tests.support.live_server import Served, serving, start_engine
from tests.support.vlm_oracle import mlx_vlm_greedy

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")


HANG_S = 3.0  # the fetch time limit of these tests' server


@pytest.fixture(scope="module")
def served(vlm_path: Path, image_files: list[Path]) -> Iterator[Served]:
    thread = start_engine(vlm_path)
    # the test's own image folder, and fetches from loopback (the test's own servers) allowed
    images = ImageAccess(
        remote=True, private=True, local_dirs=(image_files[0].parent,), timeout_s=HANG_S
    )
    with serving(thread, ServerOptions(images=images)) as server:
        yield server
    thread.shutdown()


def test_chat_with_two_images_matches_mlx_vlm(served: Served, vlm_path: Path, image_files):
    first, second = image_files[0], image_files[3]
    encoded = base64.b64encode(second.read_bytes()).decode()
    client = openai.OpenAI(base_url=served.api, api_key="none")
    reply = client.chat.completions.create(
        model=str(vlm_path),
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": first.as_uri()}},
                    {"type": "text", "text": "compare"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}},
                ],
            }
        ],
        max_tokens=6,
        temperature=0,
        logprobs=True,
    )
    tokenizer = served.thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    expected = mlx_vlm_greedy(vlm_path, "<s>[INST][IMG]compare[IMG][/INST]", [first, second], 6)
    assert reply.choices[0].logprobs is not None
    texts = [t.token for t in reply.choices[0].logprobs.content]
    assert texts == [tokenizer.decode([t]) for t in expected]
    assert reply.usage is not None and reply.usage.prompt_tokens > 20  # the image rows count


def test_a_bad_image_is_a_400_and_the_server_keeps_answering(
    served: Served, vlm_path: Path
) -> None:
    client = openai.OpenAI(base_url=served.api, api_key="none")
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=str(vlm_path), messages=[{"role": "user", "content": [bad]}], max_tokens=2
        )
    assert info.value.body["param"] == "messages[0].content[0]"
    assert "not a readable image" in info.value.body["message"]
    reply = client.chat.completions.create(
        model=str(vlm_path), messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"


def test_responses_and_anthropic_image_shapes_equal_chat(
    served: Served, vlm_path: Path, image_files
) -> None:
    import anthropic

    image = image_files[1]
    encoded = base64.b64encode(image.read_bytes()).decode()
    client = openai.OpenAI(base_url=served.api, api_key="none")
    expected = mlx_vlm_greedy(vlm_path, "<s>[INST][IMG]what?[/INST]", [image], 4)
    tokenizer = served.thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    response = client.responses.create(
        model=str(vlm_path),
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": f"data:image/png;base64,{encoded}"},
                    {"type": "input_text", "text": "what?"},
                ],
            }
        ],
        max_output_tokens=4,
        temperature=0,
        store=False,
    )
    assert response.output_text == tokenizer.decode(expected)
    claude = anthropic.Anthropic(base_url=served.url, api_key="none")
    source = {"type": "base64", "media_type": "image/png", "data": encoded}
    message = claude.messages.create(
        model=str(vlm_path),
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},
                    {"type": "text", "text": "what?"},
                ],
            }
        ],
        max_tokens=4,
        extra_body={"temperature": 0},  # this client version has no temperature argument
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == tokenizer.decode(expected)


def test_hanging_image_urls_do_not_hold_up_a_text_request(served: Served, vlm_path: Path) -> None:
    """Eight requests whose image URL never answers: a plain text request is answered at once
    (fetches run on their own pool, not the one that templates and tokenizes everyone's), and
    each image request ends with the fetch error at its time limit."""
    import socket
    import threading
    import time

    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/photo.png"
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0, timeout=60)
    failures: list[tuple[Exception, float]] = []

    def ask_with_the_hanging_image() -> None:
        part = {"type": "image_url", "image_url": {"url": url}}
        started = time.monotonic()
        try:
            client.chat.completions.create(
                model=str(vlm_path), messages=[{"role": "user", "content": [part]}], max_tokens=2
            )
        except Exception as exc:  # the 400, read below
            failures.append((exc, time.monotonic() - started))

    try:
        waiting = [threading.Thread(target=ask_with_the_hanging_image) for _ in range(8)]
        for thread in waiting:
            thread.start()
        time.sleep(0.5)  # the eight are fetching
        started = time.monotonic()
        reply = client.chat.completions.create(
            model=str(vlm_path), messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        took = time.monotonic() - started
        assert reply.choices[0].finish_reason == "length"
        assert all(thread.is_alive() for thread in waiting)  # still hanging
        assert took < HANG_S / 2, f"a text request took {took:.2f} s behind hanging fetches"
        for thread in waiting:
            thread.join(timeout=30)
    finally:
        silent.close()
    assert len(failures) == 8
    for failure, waited in failures:
        assert isinstance(failure, openai.BadRequestError)
        assert failure.body["message"].endswith(f"could not fetch the image at {url}")
        assert HANG_S - 0.5 < waited < HANG_S + 5
