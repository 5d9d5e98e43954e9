"""OpenAI-style errors: one exception type that knows its HTTP status and renders the body
OpenAI clients parse (``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


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
                "type": _TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None) -> APIError:
    """A 400 for a bad request field."""
    return APIError(400, message, param=param)


def engine_unavailable(reason: str | None) -> APIError:
    """The 503 sent at once when the engine thread is gone, instead of letting clients hang."""
    detail = f": {reason}" if reason else ""
    return APIError(
        503,
        f"the engine is not running{detail}; restart `macbatch serve`",
        code="engine_unavailable",
    )
