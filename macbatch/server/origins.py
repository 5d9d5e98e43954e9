"""Which ``Host`` and ``Origin`` a request may carry: the server's defence against web pages.

A keyless server on loopback is still reachable from any page the user's browser opens. Two
ways in: a cross-site "simple" request (a ``text/plain`` chat body or a multipart upload, sent
without a preflight; the browser adds an ``Origin`` header naming the page), and DNS rebinding
(the page's own name re-resolved to 127.0.0.1, so the browser sees a same-origin request and
sends ``Host: evil.example``). So a request is refused (403) when its ``Host`` is not a name the
server answers to, or when it has an ``Origin`` that is neither the server itself nor allowed.
OpenAI's clients, curl and scripts send no ``Origin`` and an address as ``Host``: unaffected.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from macbatch.server.errors import APIError, speaks_anthropic

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY = "*"


def split_host(value: str) -> tuple[str, int | None]:
    """``Host``'s name (lowercase, no brackets or trailing dot) and port (None if absent)."""
    value = value.strip().lower()
    name, port = value, None
    if value.startswith("["):  # [::1]:8000
        name, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
    else:
        port_text = ""
    if port_text.isdigit():
        port = int(port_text)
    return name.rstrip("."), port


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_host_names(bound_host: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The names a request's ``Host`` may give (None: any): the loopback names, the bound host,
    the machine's own name (and its ``.local`` one) when bound to every interface, and
    ``extra`` (``serve --allowed-hosts``; ``*`` allows any)."""
    extra = [name.strip().lower() for name in extra if name.strip()]
    if ANY in extra:
        return None
    bound = bound_host.strip("[]").lower()
    names = {*LOOPBACK_NAMES, bound, *(split_host(name)[0] for name in extra)}
    if bound in ("0.0.0.0", "::", ""):
        machine = socket.gethostname().lower().rstrip(".")
        names |= {machine, machine.split(".")[0] + ".local"}
    return frozenset(names)


def normalized_origins(origins: Iterable[str]) -> frozenset[str] | None:
    """``serve --allowed-origins`` as compared (None: any): lowercase, no trailing slash."""
    normalized = {origin.strip().lower().rstrip("/") for origin in origins if origin.strip()}
    return None if ANY in normalized else frozenset(normalized)


class HostOriginGuard:
    """Pure ASGI middleware: 403 for a ``Host`` the server does not answer to (an address is
    always fine: rebinding needs a name), and for an ``Origin`` that is not this server's own
    (same scheme, name and port as ``Host``) nor allowed. Every path and method, ``/health``
    too: a browser sends ``Origin`` on cross-site writes, and a read it sends it on is cross-site
    too."""

    def __init__(
        self, app: ASGIApp, hosts: frozenset[str] | None, origins: frozenset[str] | None
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        refusal = self._host_refusal(host)
        if refusal is None and origin is not None:
            refusal = self._origin_refusal(origin.decode("latin-1"), host)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        error = APIError(403, refusal[0], code=refusal[1])
        await error.response(speaks_anthropic(scope["path"]))(scope, receive, send)

    def _host_refusal(self, host: str) -> tuple[str, str] | None:
        name = split_host(host)[0]
        if not host or self.hosts is None or name in self.hosts or _is_address(name):
            return None
        return (
            f"Host {host!r} is not a name this server answers to (a page re-pointing its own "
            "name here is refused); add it with serve --allowed-hosts",
            "host_not_allowed",
        )

    def _origin_refusal(self, origin: str, host: str) -> tuple[str, str] | None:
        normalized = origin.strip().lower().rstrip("/")
        if self.origins is None or normalized in self.origins:
            return None
        if host and _same_origin(normalized, host):
            return None
        return (
            f"requests from web pages at {origin!r} are refused (a page could use this server "
            "without you knowing); allow that origin with serve --allowed-origins",
            "origin_not_allowed",
        )


def _same_origin(origin: str, host: str) -> bool:
    """``Origin`` names this server as the client reached it: http, the same name and port."""
    try:
        parts = urlsplit(origin)
        port = parts.port or 80
    except ValueError:
        return False
    name, host_port = split_host(host)
    return parts.scheme == "http" and (parts.hostname or "") == name and port == (host_port or 80)
