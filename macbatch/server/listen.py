"""Where the server listens and how it stops: loopback checks, binding the port before the model
loads, and uvicorn run with signal handling that ends in a clean exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp


class ListenError(Exception):
    """The address cannot be used; the message says what to do."""


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def bind(host: str, port: int) -> socket.socket:
    """A bound socket, made before the model loads so a taken port fails at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {host}:{port}: {exc.strerror}; stop the program using it "
            "or pick another --port"
        ) from None
    return sock


FLUSH_S = 3  # after the deadline's aborts, time for streams to send their last chunk and [DONE]


class _Server(uvicorn.Server):
    """uvicorn's server with macbatch's way to stop.

    uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, which would end the process
    with a signal status; macbatch treats both as a normal stop and exits 0. At the shutdown
    deadline ``on_deadline`` aborts what is still generating, so every client gets a proper end
    (a final chunk and [DONE], or a JSON error) instead of a cut connection.
    """

    def __init__(
        self, config: uvicorn.Config, deadline_s: float, on_deadline: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self.deadline_s = deadline_s
        self.on_deadline = on_deadline

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = asyncio.get_running_loop().call_later(self.deadline_s, self.on_deadline)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()


def run(
    app: ASGIApp,
    sock: socket.socket,
    shutdown_timeout: float,
    log_level: str,
    on_deadline: Callable[[], None],
) -> None:
    """Serve until SIGINT/SIGTERM: stop accepting, let in-flight requests finish for up to
    ``shutdown_timeout`` seconds, then call ``on_deadline`` to abort the rest; streams still
    open a few seconds later are cut."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(shutdown_timeout)) + FLUSH_S,
    )
    _Server(config, shutdown_timeout, on_deadline).run(sockets=[sock])
