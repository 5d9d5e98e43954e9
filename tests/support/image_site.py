"""A 127.0.0.1 HTTP server a test starts and stops, serving fixed answers and counting the
requests it gets (image fetching: whether a URL was reached at all)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

Routes = dict[str, tuple[int, dict[str, str], bytes]]


class Site:
    """A 127.0.0.1 HTTP server: ``routes`` path -> (status, headers, body); counts requests."""

    def __init__(self, routes: Routes) -> None:
        self.routes, self.hits, self.hosts = routes, 0, []
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                site.hits += 1
                site.hosts.append(self.headers.get("Host"))
                status, headers, body = site.routes.get(self.path, (404, {}, b"no"))
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"


@contextmanager
def site(routes: Routes) -> Iterator[Site]:
    served = Site(routes)
    runner = threading.Thread(target=served.server.serve_forever, daemon=True)
    runner.start()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()
        runner.join(timeout=10)
