"""Ollama's routes on the server's router: /api/chat and /api/generate through the same queue,
drafts and exactness as /v1/chat/completions; /api/tags, /api/ps and /api/show describe the one
model served; /api/version. Model management (pull, push, create, copy, delete) and embeddings
are answered 404 with what this server does instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_spec import __version__
from edge_spec.api import EdgeSpec
from edge_spec.server.errors import read_json
from edge_spec.server.ollama_api.answer import OllamaShape, details, model_entry
from edge_spec.server.ollama_api.request import (
    OllamaRequest,
    parse_ollama_chat,
    parse_ollama_generate,
)
from edge_spec.server.schemas import APIError, ParsedRequest, RequestLimits
from edge_spec.server.worker import Worker

Serve = Callable[[Request, ParsedRequest, OllamaShape], Awaitable[Response]]
CheckModel = Callable[[str], None]  # the app's: 404 unless a name of the served model
FAR_FUTURE = "2318-01-01T00:00:00Z"  # /api/ps: the model stays loaded while the server runs


def served_name(name: str, model_ids: tuple[str, ...]) -> str:
    """The served model an Ollama client means: its names carry a tag (`NAME:latest` is NAME
    here), and a model served from Ollama's store (`ollama:NAME[:TAG]`) is asked for by the
    name Ollama gives it. Any other name is returned as it is (and answered 404)."""
    if name in model_ids:
        return name
    bare = name.removesuffix(":latest")
    tagged = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    for candidate in (bare, f"ollama:{name}", f"ollama:{bare}", f"ollama:{tagged}"):
        if candidate in model_ids:
            return candidate
    return name


def add_ollama_routes(
    router: APIRouter,
    *,
    model_ids: tuple[str, ...],
    limits: RequestLimits,
    max_request_bytes: int,
    worker: Worker,
    serve: Serve,
    check_model: CheckModel,
) -> None:
    async def generation(request: Request, parse: Callable[..., OllamaRequest]) -> Response:
        req = parse(await read_json(request, max_request_bytes), limits)
        tools = req.parsed is not None and req.parsed.config.tool_mode != "none"
        shape = OllamaShape(req.model, req.chat, tools=tools, logprobs=req.logprobs)
        if req.parsed is None:  # nothing to generate: Ollama's "load the model"
            check_model(req.model)
            return JSONResponse(shape.loaded())
        return await serve(request, req.parsed, shape)

    @router.post("/api/chat")
    async def chat(request: Request) -> Response:
        return await generation(request, parse_ollama_chat)

    @router.post("/api/generate")
    async def generate(request: Request) -> Response:
        return await generation(request, parse_ollama_generate)

    async def described(run: Callable[[EdgeSpec], dict[str, Any]]) -> JSONResponse:
        return JSONResponse(await asyncio.to_thread(worker.with_spec, run))

    @router.get("/api/tags")
    async def tags() -> JSONResponse:
        def run(spec: EdgeSpec) -> dict[str, Any]:
            info = spec.target.info
            return {"models": [model_entry(model_ids[0], info, info.n_ctx)]}

        return await described(run)

    @router.get("/api/ps")
    async def running() -> JSONResponse:
        def run(spec: EdgeSpec) -> dict[str, Any]:
            info = spec.target.info
            entry = model_entry(model_ids[0], info, info.n_ctx)
            offloaded = spec.target.n_gpu_layers != 0  # all of it, or some: counted whole
            entry.update(expires_at=FAR_FUTURE, size_vram=info.file_size_bytes if offloaded else 0)
            return {"models": [entry]}

        return await described(run)

    @router.post("/api/show")
    async def show(request: Request) -> JSONResponse:
        body = await read_json(request, max_request_bytes)
        if isinstance(body, Mapping) and "model" not in body and "name" in body:
            body = {**body, "model": body["name"]}  # older clients
        name = body.get("model") if isinstance(body, Mapping) else None
        if not isinstance(name, str):
            raise APIError(400, "model is required", param="model")
        check_model(name)

        def run(spec: EdgeSpec) -> dict[str, Any]:
            info = spec.target.info
            arch = info.architecture or "llama"
            return {
                "license": "",
                "modelfile": f"FROM {info.path}\n",
                # What clients read the served context from (Ollama's PARAMETER lines).
                "parameters": f"num_ctx {info.n_ctx}",
                "template": spec.chat_template.text,  # Jinja, the GGUF's own (not Go's)
                "details": details(info),
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": info.n_params,
                    f"{arch}.context_length": info.n_ctx_train,
                },
                "capabilities": ["completion", "tools"],
                "modified_at": model_entry(name, info, info.n_ctx)["modified_at"],
            }

        return await described(run)

    @router.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "DELETE", "HEAD", "PUT"])
    async def not_here(rest: str) -> None:
        raise APIError(
            404,
            f"/api/{rest} is not served here: edge-spec serves the model it was started with "
            "(no pull, push, create, copy, delete or embeddings); /api/chat, /api/generate, "
            "/api/tags, /api/show, /api/ps and /api/version are",
        )
