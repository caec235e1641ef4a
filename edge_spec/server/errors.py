"""Requests in and errors out: a request body read within its size bound as JSON, and every
error answered as a JSON body with its HTTP status, in OpenAI's shape (Anthropic's and
Ollama's on their routes). Nothing escapes as a bare 500: an unexpected exception is logged
and answered as a server error."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge_spec.errors import ContextOverflowError, InvalidRequestError, RpcError
from edge_spec.server.messages_api import error_body
from edge_spec.server.schemas import APIError
from edge_spec.server.worker import UnavailableError

log = logging.getLogger(__name__)


async def read_json(request: Request, limit_bytes: int) -> Any:
    too_large = APIError(
        413, f"the request body is larger than {limit_bytes} bytes", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > 8 * limit_bytes:
        raise too_large  # not worth reading
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit_bytes:
            chunks.append(chunk)
        elif size > 8 * limit_bytes:
            break
    # Read (and drop) a moderately oversized body so the client sees the 413, not a reset.
    if size > limit_bytes:
        raise too_large
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(
            400, f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise APIError(
            400, "the request body nests too deeply to be a request", code="invalid_json"
        ) from None


def api_error(exc: BaseException, param: str | None = None) -> APIError:
    """`param`: what a prompt too long for the context is blamed on."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return APIError(413, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), code="invalid_value")
    if isinstance(exc, RpcError):
        return APIError(503, str(exc), type="server_error", code="rpc_server_lost")
    if isinstance(exc, UnavailableError):
        return APIError(
            503,
            f"the server is {exc} and cannot take requests",
            type="server_error",
            code="unavailable",
        )
    log.error("request failed: %r", exc)
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")


def install_error_handlers(app: FastAPI) -> None:
    def as_json(request: Request, error: APIError) -> JSONResponse:
        """OpenAI's error shape, or Anthropic's or Ollama's on their routes."""
        body = error.body()
        if request.url.path.startswith("/v1/messages"):
            body = error_body(error.status, error.message)
        elif request.url.path.startswith("/api/"):
            body = {"error": error.message}
        return JSONResponse(body, status_code=error.status, headers=error.headers)

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        return as_json(request, api_error(exc))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        return as_json(request, APIError(400, f"invalid request: {exc}", code="invalid_request"))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = "unknown route" if exc.status_code == 404 else str(exc.detail)
        return as_json(request, APIError(exc.status_code, message, code=f"http_{exc.status_code}"))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_api_error)
