"""Clients that hold connections without finishing requests (issue 46, item 8): headers that
never end are cut at the header timeout, connections past the cap are closed at once, and a
chunked upload is refused at the file limit instead of being read to its end. Every socket here
goes to the 127.0.0.1 server the test starts, a bounded number of them for a bounded time."""

from __future__ import annotations

import json
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions
from macbatch.server.listen import ConnectionLimits, default_max_connections
from tests.support.live_server import Served, serving
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until

PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # never ends


def _open(served: Served, first: bytes = PARTIAL) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1])), timeout=5)
    if first:
        sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True once the server closes the socket (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def test_headers_never_finished_are_closed_and_health_answers_meanwhile(
    engine_thread: EngineThread,
) -> None:
    with serving(engine_thread, limits=ConnectionLimits(header_timeout_s=1.5)) as served:
        slow = [_open(served) for _ in range(50)]
        silent = _open(served, first=b"")  # connects and sends nothing
        again = _open(served, first=b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert again.recv(65536).startswith(b"HTTP/1.1 200")
        again.sendall(PARTIAL)  # kept alive, then a second request that never ends
        try:
            started = time.monotonic()
            assert httpx.get(served.url + "/health", timeout=5).status_code == 200
            assert all(_closed_by_server(s, within_s=6) for s in [*slow, silent, again])
            assert time.monotonic() - started < 8
            assert httpx.get(served.url + "/health", timeout=5).status_code == 200
        finally:
            for sock in [*slow, silent, again]:
                sock.close()


def test_a_request_whose_headers_ended_is_not_cut_by_the_header_timeout(
    engine_thread: EngineThread,
) -> None:
    model = engine_thread.info.model_name.encode()
    body = b'{"model": "%s", "prompt": "hi", "max_tokens": 2}' % model
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with serving(engine_thread, limits=ConnectionLimits(header_timeout_s=0.5)) as served:
        sock = _open(served, head)
        try:
            time.sleep(1.2)  # the body comes late: only the headers are timed
            sock.sendall(body)
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            sock.close()


def test_past_the_cap_the_oldest_idle_connection_makes_room(engine_thread: EngineThread) -> None:
    """Issue 61, item 12: at the cap a new connection is taken and the oldest one still waiting
    for its headers is closed for it (before, the new one was closed: hung clients kept every
    new one out until they timed out)."""
    limits = ConnectionLimits(header_timeout_s=300, max_connections=8)
    with serving(engine_thread, limits=limits) as served:
        held = [_open(served) for _ in range(8)]
        try:
            assert httpx.get(served.url + "/health", timeout=30).status_code == 200
            assert _closed_by_server(held[0], within_s=30)  # the oldest made room
            assert httpx.get(served.url + "/health", timeout=30).status_code == 200
        finally:
            for sock in held:
                sock.close()


def test_the_default_cap_leaves_half_the_descriptors_to_the_rest() -> None:
    cap = default_max_connections()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert 16 <= cap <= 1024
    assert soft == resource.RLIM_INFINITY or cap <= max(16, soft // 2)


CHUNK = 256 * 1024


def _chunks(total: int, yielded: list[int]) -> Iterator[bytes]:
    """A multipart upload of ``total`` bytes of JSONL in HTTP chunks, counting what it yields."""
    boundary = b"xyz"
    head = (
        b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n"
    )
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    payload = line * (CHUNK // len(line))
    pieces = [head] + [payload] * (total // len(payload)) + [b"\r\n--" + boundary + b"--\r\n"]
    for piece in pieces:
        yielded[0] += len(piece)
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


def test_a_chunked_upload_is_refused_at_the_limit_not_read_to_its_end(
    engine_thread: EngineThread, tmp_path: Path
) -> None:
    limit = 1024 * 1024
    options = ServerOptions(data_dir=tmp_path / "serve", max_file_bytes=limit)
    with serving(engine_thread, options) as served:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.connect(("127.0.0.1", int(served.url.rsplit(":", 1)[1])))
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: multipart/form-data; boundary=xyz\r\n\r\n"
        )
        yielded = [0]
        pending, started = b"", time.monotonic()
        sock.setblocking(False)
        try:
            for piece in _chunks(80 * 1024 * 1024, yielded):  # 80 MiB against 1 MiB
                pending += piece
                while pending:
                    readable, writable, _ = select.select([sock], [sock], [], 10)
                    if readable or not writable:
                        break
                    pending = pending[sock.send(pending) :]
                if pending:
                    break  # the server answered, or stopped reading
            sock.setblocking(True)
            sock.settimeout(10)
            answer = sock.recv(65536)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        # the limit, one chunk, and what the two sockets' buffers hold on loopback
        assert yielded[0] < limit + CHUNK + 16 * 1024 * 1024, yielded[0]
        assert time.monotonic() - started < 20


def _port(served: Served) -> int:
    return int(served.url.rsplit(":", 1)[1])


def test_a_trickled_body_is_cut_at_the_body_timeout(engine_thread: EngineThread) -> None:
    """Headers, then a body that never ends (a byte at a time): the connection is closed once
    the body timeout passes, long before the body could end, and the server answers meanwhile."""
    limits = ConnectionLimits(header_timeout_s=30, body_timeout_s=1.5)
    with serving(engine_thread, limits=limits) as served:
        sock = socket.create_connection(("127.0.0.1", _port(served)), timeout=5)
        head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        sock.sendall(
            f"{head}Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n".encode()
        )
        sent, closed = 0, False
        try:
            while sent < 100 and not closed:  # 4000 bytes would take minutes at this rate
                sock.sendall(b" ")
                sent += 1
                readable, _, _ = select.select([sock], [], [], 0.1)
                closed = bool(readable) and not sock.recv(65536)
        except ConnectionError:
            closed = True
        finally:
            sock.close()
        assert closed, f"the server still read the body after {sent} trickled bytes"
        assert httpx.get(served.url + "/health", timeout=5).status_code == 200


def test_a_stream_whose_reader_stopped_is_cut_and_its_request_cancelled(
    engine_thread: EngineThread,
) -> None:
    """A client asks for a long stream and never reads it: once the send buffers are full for
    the write timeout the connection is closed, and the request is cancelled (an abort, not a
    finish) with its KV freed and its place in the queue given back."""
    limits = ConnectionLimits(write_timeout_s=1)
    with serving(engine_thread, limits=limits, send_buffer=4096) as served:
        aborted = 'macbatch_requests_total{finish_reason="abort"}'
        before = scrape(served).get(aborted, 0)
        body = {
            "prompt": "talk", "max_tokens": 4000, "temperature": 0, "ignore_eos": True,
            "stream": True, "logprobs": 5,  # big chunks: the buffers fill in a few hundred
        }  # fmt: skip
        data = json.dumps(body).encode()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", _port(served)))
        head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        sock.sendall(head.encode() + data)  # and never read
        try:
            assert wait_until(lambda: scrape(served).get(aborted, 0) > before, timeout=60)
            stats = engine_thread.stats()
            assert wait_until(
                lambda: (s := engine_thread.stats()) is not None and s.kv_blocks_used == 0
                and s.running == 0 and s.waiting == 0, timeout=10,
            ), stats  # fmt: skip
            assert scrape(served)["macbatch_requests_pending"] == 0
        finally:
            sock.close()
