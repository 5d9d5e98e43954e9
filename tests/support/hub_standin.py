"""A local stand-in for the Hugging Face hub's HTTP API, for ``macbatch pull`` without a network:
the endpoints huggingface-hub calls to download a model (repo info, the file tree, ``resolve``
with HEAD and ranged GET), over one repository's files on disk. Large files (``*.safetensors``)
are LFS files, their ETag the sha256 the hub declares. It can cut a file's first transfer short
(``cut_after``: the connection drops after that many bytes) and serve other bytes than it declares
(``corrupt``: a bad checksum) and list files it does not serve (``listed_only``: a hostile
tree, paths climbing out of the cache); ``requests`` logs each method, path and Range header."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    repo: str
    folder: Path
    cut_after: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before a drop
    corrupt: set[str] = field(default_factory=set)  # files served with one byte changed
    listed_only: list[dict] = field(default_factory=list)  # more rows of the tree, no file
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.iterdir() if p.is_file())

    def entry(self, path: Path) -> dict:
        data = path.read_bytes()
        git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        row: dict = {"type": "file", "oid": git, "size": len(data), "path": path.name}
        if path.suffix == ".safetensors":
            row["lfs"] = {
                "oid": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "pointerSize": 134,
            }
        return row

    def app(self) -> Starlette:
        async def info(request: Request) -> Response:
            self._log(request)
            siblings = [{"rfilename": p.name, "size": p.stat().st_size} for p in self.files()]
            body = {"id": self.repo, "modelId": self.repo, "sha": COMMIT, "private": False}
            return JSONResponse(body | {"siblings": siblings, "tags": [], "downloads": 0})

        async def tree(request: Request) -> Response:
            self._log(request)
            return JSONResponse([self.entry(p) for p in self.files()] + self.listed_only)

        async def resolve(request: Request) -> Response:
            self._log(request)
            name = request.path_params["file"]
            path = self.folder / name
            if not path.is_file():
                return JSONResponse(
                    {"error": "not found"},
                    status_code=404,
                    headers={"X-Error-Code": "EntryNotFound"},
                )
            row = self.entry(path)
            data = path.read_bytes()
            if name in self.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            etag = row["lfs"]["oid"] if "lfs" in row else row["oid"]
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if request.method == "HEAD":
                return Response(headers=headers | {"Content-Length": str(len(data))})
            start = _range_start(request.headers.get("range"))
            body = data[start:]
            cut = self.cut_after.pop(name, None)
            status = 206 if start else 200
            headers |= {"Content-Length": str(len(body))}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return StreamingResponse(_chunks(body, cut), status_code=status, headers=headers)

        owner_name = "/{owner}/{name}"
        return Starlette(
            routes=[
                Route("/api/models" + owner_name + "/revision/{rev}", info),
                Route("/api/models" + owner_name, info),
                Route("/api/models" + owner_name + "/tree/{rev}", tree),
                Route(owner_name + "/resolve/{rev}/{file:path}", resolve, methods=["GET", "HEAD"]),
            ]
        )

    def _log(self, request: Request) -> None:
        self.requests.append((request.method, request.url.path, request.headers.get("range")))


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-")[0] or 0)


async def _chunks(body: bytes, cut: int | None) -> AsyncIterator[bytes]:
    step = 64 * 1024
    end = len(body) if cut is None else cut
    for i in range(0, end, step):
        yield body[i : min(i + step, end)]
    if cut is not None:
        raise ConnectionError("the stand-in hub dropped the connection")  # mid-body: truncated


@contextmanager
def running(hub: Hub) -> Iterator[str]:
    """Serve ``hub`` on a free loopback port; yields its endpoint URL."""
    config = uvicorn.Config(hub.app(), host="127.0.0.1", port=0, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
