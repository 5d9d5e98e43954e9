"""Where the server listens and how it stops: loopback checks, binding the port before the model
loads, and uvicorn run with signal handling that ends in a clean exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import ASGIApp

_log = logging.getLogger("macbatch.server")


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


def bind_socket(host: str, port: int) -> socket.socket:
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


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold: ``header_timeout_s`` from its opening (or its previous
    response's end) to the end of a request's headers, ``max_connections`` open at once,
    ``body_timeout_s`` from a request's headers to the end of its body, and
    ``write_timeout_s`` with a full send buffer (a reader that stopped reading)."""

    header_timeout_s: float = 10.0
    max_connections: int = 512
    body_timeout_s: float = 60.0
    write_timeout_s: float = 60.0


def default_max_connections() -> int:
    """Half the process's file descriptors (after raising the soft limit as far as the hard one
    allows, up to 4096: macOS starts processes at 256), at most 1024: the rest is for the model,
    the disk cache and the data directory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return max(16, min(1024, (4096 if soft == resource.RLIM_INFINITY else soft) // 2))


# Descriptors never given to connections, whatever --max-connections says: the model's files, the
# disk tier, the data directory's databases and the logs need them, and the connections accepted
# in one go need room before the oldest idle ones are shed for them. accept() failing with EMFILE
# must never happen: asyncio then retries accept() for the rest of its backlog in a loop, logging
# a traceback each time and scheduling a retry each time, and serves no one.
FD_RESERVE = 96
FD_FILES = 32  # of the reserve, what the process's own files may hold


def connection_cap(requested: int | None) -> int:
    """The connections open at once: ``requested`` (--max-connections) or the default, and
    never more than the descriptor limit less ``FD_RESERVE``."""
    default = default_max_connections()  # raises the soft limit as far as it may go first
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if requested is None or soft == resource.RLIM_INFINITY:
        return requested or default
    room = max(1, soft - FD_RESERVE)
    if requested > room:
        _log.warning(
            "--max-connections %d is past this process's %d file descriptors less %d kept for "
            "files: at most %d connections",
            requested, soft, FD_RESERVE, room,
        )  # fmt: skip
    return min(requested, room)


def accept_backlog(max_connections: int) -> int:
    """How many connections the listening socket queues, and asyncio accepts in one go: the
    descriptors left beyond the cap and the files, over three (a burst accepted before the
    oldest idle ones' close, the next, and one more), between 16 and uvicorn's 2048."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2048
    return max(16, min(2048, (soft - max_connections - FD_FILES) // 3))


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11, or httptools where installed) with a deadline for each
    request's headers and a cap on open connections.

    uvicorn (0.30 to 0.54) has no header timeout: a connection that never finishes its headers
    is kept forever (its keep-alive timer only runs between requests, and any byte received
    cancels it), so a few thousand of them use up the process's descriptors and the server stops
    answering. ``limit_concurrency`` does not help: it answers 503 once headers are complete,
    and such connections never complete them. Both protocols keep the request in progress in
    ``self.cycle`` and call ``on_response_complete`` after each response, so the guard arms a
    timer when a connection opens and after each response, and closes the connection if the
    timer fires while no new request has finished its headers. At the cap, a new connection
    takes the place of the oldest idle one (its headers not begun or not finished: a slow client,
    or a keep-alive connection between requests), so a new client is always answered however
    many connections hang; only when every connection has a request in progress is the new one
    closed as it is accepted.

    A request whose body has not ended ``body_timeout_s`` after its headers (a client that
    trickles it) is cut, as is a connection whose send buffer stays full for
    ``write_timeout_s`` (a stream whose reader stopped reading: uvicorn would wait for it
    forever, holding the request's place in the queue): the handler sees the disconnect and
    cancels its engine requests, which frees their KV.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol
    refused_log = [0.0]
    idle: dict[Any, None] = {}  # connections waiting for a request's headers, oldest first

    def warn(text: str) -> None:
        now = time.monotonic()
        if now - refused_log[0] > 10:
            refused_log[0] = now
            _log.warning(text, limits.max_connections)

    class Guarded(base):
        _header_timer: asyncio.TimerHandle | None = None
        _write_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None  # the request in progress's body

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                if not idle:
                    warn("%d connections open, each with a request (serve --max-connections): "
                         "closing new ones")  # fmt: skip
                    transport.abort()
                    return
                warn("%d connections open, the most allowed (serve --max-connections): "
                     "closing the oldest idle ones for new ones")  # fmt: skip
                oldest = next(iter(idle))
                del idle[oldest]
                oldest.transport.abort()
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            idle.pop(self, None)
            idle[self] = None  # the newest idle one
            waiting = self.cycle
            self._header_timer = self.loop.call_later(
                limits.header_timeout_s, self._headers_late, waiting
            )

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self, waiting: Any) -> None:
            self._header_timer = None
            idle = self.cycle is waiting and (waiting is None or waiting.response_complete)
            if idle and not self.transport.is_closing():
                self.transport.abort()

        def on_response_complete(self) -> None:
            self._arm()  # before pipelined requests start: they are seen as a new cycle
            super().on_response_complete()

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            cycle = self.cycle
            if cycle is not before and cycle is not None:
                idle.pop(self, None)  # its request's headers are in: no longer idle
            if cycle is not before and cycle is not None and cycle.more_body:
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self.loop.call_later(
                    limits.body_timeout_s, self._body_late, cycle
                )

        def _body_late(self, cycle: Any) -> None:
            if cycle is self.cycle and cycle.more_body and not self.transport.is_closing():
                self._cut("its request body did not end", limits.body_timeout_s, "body")

        def pause_writing(self) -> None:
            super().pause_writing()
            self._write_timer = self.loop.call_later(limits.write_timeout_s, self._write_late)

        def resume_writing(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().resume_writing()

        def _write_late(self) -> None:
            self._write_timer = None
            if not self.transport.is_closing():
                self._cut("its reader stopped reading", limits.write_timeout_s, "write")

        def _cut(self, why: str, after_s: float, option: str) -> None:
            _log.warning(
                "closed a connection from %s: %s within %g s (serve --%s-timeout)",
                self.client[0] if self.client else "?", why, after_s, option,
            )  # fmt: skip
            self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            idle.pop(self, None)
            for timer in (self._body_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

    return Guarded


def server_config(
    app: ASGIApp, limits: ConnectionLimits, log_level: str, **more: Any
) -> uvicorn.Config:
    """uvicorn's settings for macbatch: the guarded protocol, no lifespan."""
    return uvicorn.Config(
        app,
        lifespan="off",
        log_level=log_level,
        http=guarded_protocol(limits),
        backlog=accept_backlog(limits.max_connections),
        **more,
    )


def run(
    app: ASGIApp,
    sock: socket.socket,
    shutdown_timeout: float,
    log_level: str,
    on_deadline: Callable[[], None],
    limits: ConnectionLimits,
) -> None:
    """Serve until SIGINT/SIGTERM: stop accepting, let in-flight requests finish for up to
    ``shutdown_timeout`` seconds, then call ``on_deadline`` to abort the rest; streams still
    open a few seconds later are cut."""
    config = server_config(
        app,
        limits,
        log_level,
        timeout_graceful_shutdown=max(1, round(shutdown_timeout)) + FLUSH_S,
    )
    _Server(config, shutdown_timeout, on_deadline).run(sockets=[sock])
