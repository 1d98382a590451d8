"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` for every failure.

`APIError` is raised by route code and renders itself in that shape (`body`, `response`); the handlers installed
by `install_error_handlers` turn it, FastAPI's validation errors, malformed JSON, unknown routes and wrong methods
into that shape with a 4xx status.
An unexpected exception becomes a 500 in the same shape (a server bug, never a client's doing).
"""

from __future__ import annotations

import logging
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("lilicorr.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": safe_text(self.message, 2000), "type": kind,
                          "param": None if self.param is None else safe_text(self.param), "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def safe_text(s: object, limit: int = 200) -> str:
    """`s` as printable UTF-8, cut to `limit` characters: client strings (lone surrogates too) in messages."""
    s = str(s)
    s = s if len(s) <= limit else s[:limit] + "..."
    return s.encode("utf-8", "replace").decode("utf-8")


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str], str]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    if e.get("type") == "json_invalid":
        return f"request body is not valid JSON: {e.get('msg')}", None, "invalid_json"
    if e.get("type") == "missing":
        return f"missing required field {param!r}", param, "missing_field"
    msg = e.get("msg", "invalid value")
    return (f"invalid value for {param!r}: {msg}" if param else f"invalid request body: {msg}"), param, "invalid_value"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param, code = _validation_message(exc)
        return APIError(400, message, param, code).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        status = exc.status_code
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}.get(status, str(exc.detail))
        return APIError(status, message, None, None, dict(exc.headers or {})).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal_error").response()
