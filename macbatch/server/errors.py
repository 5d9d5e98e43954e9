"""Errors answered to clients: one exception type that knows its HTTP status and renders the body
OpenAI clients parse (``{"error": {"message", "type", "param", "code"}}``), or, on Anthropic's
Messages routes, the one Anthropic clients parse (``{"type": "error", "error": {"type",
"message"}}``)."""

from __future__ import annotations

import os
from pathlib import Path

from starlette.responses import JSONResponse

from macbatch.models.pool import ModelRefused

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}

# Anthropic's error types (docs.anthropic.com, "Errors"); 503 is its "overloaded" (529)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_ROUTE = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    """Whether errors on ``path`` take Anthropic's shape (the Messages API and its subpaths)."""
    return path == ANTHROPIC_ROUTE or path.startswith(ANTHROPIC_ROUTE + "/")


class APIError(Exception):
    """An error answered to the client; ``param`` names the request field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, _fallback(self.status, "server_error")),
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, object]:
        kind = _ANTHROPIC_TYPES.get(self.status, _fallback(self.status, "api_error"))
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic: bool = False) -> JSONResponse:
        body = self.anthropic_body() if anthropic else self.body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _fallback(status: int, server: str) -> str:
    """The type of a status neither table lists (409 ...): the client's fault below 500."""
    return "invalid_request_error" if status < 500 else server


def invalid(message: str, param: str | None = None) -> APIError:
    """A 400 for a bad request field."""
    return APIError(400, message, param=param)


def within(message: str, data_dir: Path | None) -> str:
    """``message`` with paths in the data directory shown relative to it: what clients read
    says which file, never where this machine keeps them."""
    if data_dir is None:
        return message
    for root in sorted({str(data_dir), str(data_dir.resolve())}, key=len, reverse=True):
        message = message.replace(root + os.sep, "").replace(root, ".")
    return message


def engine_unavailable(reason: str | None) -> APIError:
    """The 503 sent at once when the engine thread is gone, instead of letting clients hang."""
    detail = f": {reason}" if reason else ""
    return APIError(
        503,
        f"the engine is not running{detail}; restart `macbatch serve`",
        code="engine_unavailable",
    )


def refused(exc: ModelRefused) -> APIError:
    """The pool's refusal of a model as the answer a client reads."""
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return APIError(exc.status, exc.message, param=exc.param, code=exc.code, headers=headers)
