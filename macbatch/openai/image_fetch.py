"""Fetching an image URL for a request without making the server a proxy into its own network.

The host is resolved once and every address checked (loopback, private, link-local and other
non-public addresses are refused unless allowed); the connection goes to the checked address,
so no second lookup can answer differently (DNS rebinding). Redirects are followed by hand, each
target checked the same way. Every failure raises the same ``FetchFailed`` with nothing of its
cause, so a client cannot tell a refused port from a closed one or a private address from a
missing page (a port scanner otherwise). Fetches run on their own bounded pool and the caller
waits at most the time limit, whatever DNS or the far end does: a hanging URL costs its own
request its time limit and never holds up the threads that template and tokenize everyone's.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 3
FETCH_WORKERS = 8  # fetches at once; more wait their turn within their own time limit
_FETCHES = ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="image-fetch")
_REDIRECTS = (301, 302, 303, 307, 308)
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class FetchFailed(Exception):
    """The URL gave no image bytes: refused, unreachable, slow, too big or not a 200."""


def fetch(url: str, *, private: bool, timeout_s: float, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of ``url`` within ``timeout_s`` in all (DNS, redirects, reading);
    ``private``: loopback, private and link-local addresses may be fetched too."""
    deadline = time.monotonic() + timeout_s
    job = _FETCHES.submit(_fetch, url, private, deadline, max_bytes)
    try:
        return job.result(timeout=timeout_s)
    except FutureTimeout:
        job.cancel()  # still queued: never starts; running: its socket times out on its own
        raise FetchFailed from None
    except FetchFailed:
        raise
    except Exception as exc:  # any socket, TLS, HTTP or parsing error reads the same
        raise FetchFailed from exc


def _fetch(url: str, private: bool, deadline: float, max_bytes: int) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchFailed
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = _checked_address(parts.hostname, port, private)
        connection = _connection(parts.scheme, parts.hostname, port, address, deadline)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request("GET", target, headers={"Accept": "image/*"})
            response = connection.getresponse()
            if response.status in _REDIRECTS and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                continue
            if response.status != 200:
                raise FetchFailed
            return _read(response, deadline, max_bytes)
        finally:
            connection.close()
    raise FetchFailed


def _checked_address(host: str, port: int, private: bool) -> str:
    """The address to connect to: the first the host resolves to, when every one is public
    (or ``private`` allows them all)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses or not (private or all(_public(a) for a in addresses)):
        raise FetchFailed
    return str(addresses[0])


def _public(address: _Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _connection(
    scheme: str, host: str, port: int, address: str, deadline: float
) -> http.client.HTTPConnection:
    """A connection that names ``host`` (Host header, TLS server name and certificate check)
    but reaches ``address``, the one checked."""
    timeout = _left(deadline)
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    connection = kind(host, port, timeout=timeout)

    def to_checked(_where: Any, *args: Any, **kwargs: Any) -> socket.socket:
        return socket.create_connection((address, port), *args, **kwargs)

    connection._create_connection = to_checked  # type: ignore[attr-defined]
    return connection


def _read(response: http.client.HTTPResponse, deadline: float, max_bytes: int) -> bytes:
    """The body, cut off past ``max_bytes`` or the deadline (a server sending a byte now and
    then is cut off too, not only one that never answers)."""
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise FetchFailed
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise FetchFailed
        chunks.append(chunk)
        _left(deadline)
    return b"".join(chunks)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchFailed
    return left
