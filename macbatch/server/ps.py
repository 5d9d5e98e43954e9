"""``GET /macbatch/ps``: the models a running serve holds now, what each takes, how long it has
been idle and how many requests it has answered, for ``macbatch ps`` (Ollama's ``ps``). A route
of macbatch's own, beside the OpenAI ones, so no client of /v1/models sees new fields."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from macbatch.models.pool import Loaded
from macbatch.server.serving import ServerState, state_of


def loaded_rows(state: ServerState) -> list[dict[str, Any]]:
    """One row per loaded model, most recently used first."""
    now, keep_alive = time.monotonic(), state.models.limits.keep_alive_s
    rows = []
    for name, loaded in sorted(state.models.loaded.items(), key=lambda m: -m[1].last_used):
        stats = loaded.thread.stats()
        idle_s = _idle_s(loaded, now)
        counted = state.model_metrics.get(name)
        unloads_in_s = None
        if idle_s is not None and keep_alive is not None and not loaded.pinned:
            unloads_in_s = max(0.0, round(keep_alive - idle_s, 1))
        rows.append(
            {
                "model": name,
                "weights_bytes": loaded.need.weights,
                "kv_cache_bytes": 0 if stats is None else stats.kv_cache_bytes,
                "active_requests": loaded.leases,
                "idle_s": idle_s,
                "requests": 0 if counted is None else sum(counted.finished.values()),
                "unloads_in_s": unloads_in_s,
                "adapters": sorted(loaded.adapters),
            }
        )
    return rows


def _idle_s(loaded: Loaded, now: float) -> float | None:
    """Seconds since its last request ended; None while one holds it."""
    return None if loaded.leases else round(now - loaded.last_used, 1)


async def ps(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": loaded_rows(state_of(request))})


ROUTES = [Route("/macbatch/ps", ps, methods=["GET"])]
