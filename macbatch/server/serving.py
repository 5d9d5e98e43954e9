"""What every route shares: the server's options and state, and reading a body (a request is
then served by ``generation.ServedRequest``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from macbatch.engine import EngineThread
from macbatch.models.pool import Loaded, ModelPool
from macbatch.openai import DATA_ONLY, ImageAccess
from macbatch.openai.bodies import load_json
from macbatch.server.admission import Admission
from macbatch.server.errors import APIError, invalid
from macbatch.server.metrics import ServerMetrics
from macbatch.server.stored import ResponseStore

if TYPE_CHECKING:
    from macbatch.server.batchapi.service import BatchAPI


@dataclass(frozen=True)
class ServerOptions:
    """Limits and access: ``max_pending`` bounds engine requests running plus waiting."""

    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_pending: int = 320
    model_aliases: tuple[str, ...] = ()
    # Stored responses, batch files and batches live here (macbatch serve: the data directory);
    # None: responses in memory and no Batch API.
    data_dir: Path | None = None
    max_file_bytes: int = 200 * 1024 * 1024  # one /v1/files upload (OpenAI's batch file limit)
    batch_max_in_flight: int | None = None  # a batch's requests in the engine; None: half the seqs
    # leave agent clients' volatile prompt lines in (macbatch.openai.volatile; docs/serve.md)
    keep_volatile_prompt_lines: bool = False
    # where image parts may come from (macbatch serve: --allow-remote-images, ...; serve.md)
    images: ImageAccess = DATA_ONLY
    # the names a request's Host may give and the web pages that may call it (server/origins.py)
    bound_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


@dataclass
class ServerState:
    models: ModelPool
    options: ServerOptions
    metrics: ServerMetrics = field(default_factory=ServerMetrics)  # HTTP responses by route
    model_metrics: dict[str, ServerMetrics] = field(init=False)  # each model's, by name
    responses: ResponseStore = field(init=False)  # /v1/responses, stored
    admission: Admission = field(init=False)
    shutting_down: bool = False
    batch_api: BatchAPI | None = field(init=False, default=None)
    batch_api_off: str = (  # why batch_api is None, answered on its routes
        "the Batch API needs a data directory (macbatch serve has one; see docs/serve.md)"
    )

    def __post_init__(self) -> None:
        self.model_metrics = {name: ServerMetrics() for name in self.models.catalog}
        if len(self.models.catalog) == 1:  # one model: its counters are the server's, unlabelled
            self.model_metrics[self.models.default] = self.metrics
        self.admission = Admission(self.options.max_pending)
        self.responses = ResponseStore(self.options.data_dir)

    @property
    def first(self) -> Loaded:
        """The first model given (the Batch API's, pinned while the Batch API runs)."""
        return self.models.loaded[self.models.default]

    @property
    def thread(self) -> EngineThread:
        return self.first.thread


def route_table(*rows: tuple[str, str, Callable[[Request], Awaitable[Response]]]) -> list[Route]:
    """Routes from (method, path, handler) rows."""
    return [Route(path, handler, methods=[method]) for method, path, handler in rows]


def state_of(request: Request) -> ServerState:
    return request.app.state.macbatch


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The JSON object body, refusing bodies over ``limit`` bytes before reading them whole."""
    too_large = APIError(
        413,
        f"request body over {limit} bytes; send a shorter prompt or raise serve --max-body-mb",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    data = load_json(bytes(body))
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    return data
