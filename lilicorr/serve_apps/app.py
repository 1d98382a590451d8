"""The OpenAI-compatible FastAPI app over a set of served models (no Ray here: testable with httpx alone).

    GET  /health                 200 when every engine's step loop is alive and not stalled, else 503;
                                 running / waiting requests per model
    GET  /v1/models              the served models, e.g. smollm2-135m-lilicorr, smollm2-135m-ar
    POST /v1/completions         text or token-id prompt; "stream": true gives server-sent events
    POST /v1/chat/completions    chat messages through the target's chat template

Streams are OpenAI chunks (`data: {...}` lines) ending with `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries `usage` (with the request's tau and blocks).
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from .errors import APIError, install_error_handlers, safe_text
from .generation import Generation, ServedModel
from .metrics import NULL_METRICS
from .prompts import chat_prompt, completion_prompt, engine_request
from .protocol import ChatCompletionRequest, CompletionRequest, chunk_body, completion_body, models_body

STALL_TIMEOUT_S = 120.0  # a step loop with work that has not finished a step for this long is stalled


@dataclass
class ServerState:
    models: dict[str, ServedModel]
    tokenizer: object
    enable_thinking: bool = False
    api_key: Optional[str] = None
    metrics: object = NULL_METRICS
    created: int = field(default_factory=lambda: int(time.time()))

    def model(self, name: str) -> ServedModel:
        if name not in self.models:
            raise APIError(404, f"model {safe_text(name, 100)!r} does not exist; served: {', '.join(self.models)}",
                           "model", "model_not_found")
        return self.models[name]

    def unhealthy(self) -> list[str]:
        """Why each unhealthy model is unhealthy (empty when all are fine)."""
        out = []
        for m in self.models.values():
            if not m.engine.alive:
                out.append(f"{m.name}: engine step loop is not running")
            elif m.engine.stalled(STALL_TIMEOUT_S):
                out.append(f"{m.name}: engine step loop stalled for over {STALL_TIMEOUT_S:.0f}s")
        return out


def _data(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


async def _sse(gen: Generation, rid: str, model: str, chat: bool, include_usage: bool):
    created = int(time.time())
    try:
        if chat:
            yield _data(chunk_body(rid, model, created, chat, role=True))
        async for piece in gen.pieces():
            if piece.text or piece.finish_reason:
                yield _data(chunk_body(rid, model, created, chat, text=piece.text, finish_reason=piece.finish_reason))
            if piece.finish_reason and include_usage:
                yield _data(chunk_body(rid, model, created, chat, use=piece.usage))
    except APIError as e:  # the status line is already sent: report in the stream, in the same shape
        yield _data(e.body())
    finally:
        gen.close()  # a client that went away aborts the request and frees its slot
    yield "data: [DONE]\n\n"


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="LiLiCorr OpenAI-compatible server", version="0.1.0",
                  description="Speculative decoding (LiLiCorr, DFlash, AR) behind the OpenAI HTTP API.")
    install_error_handlers(app)

    def authorize(request: Request) -> None:
        if state.api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                                 state.api_key.encode()):
            raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", None,
                           "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def run(body, chat: bool):
        model = state.model(body.model)
        if chat:
            ids = chat_prompt(body, state.tokenizer, model, state.enable_thinking)
        else:
            ids = completion_prompt(body, state.tokenizer, model)
        request, stops = engine_request(body, ids, model)
        gen = Generation(model, state.tokenizer, request, stops, state.metrics).start()  # 429 / 400 from here
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            # background: closes the generation even when the client left before the stream began
            return StreamingResponse(_sse(gen, rid, model.name, chat, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"}, background=BackgroundTask(gen.close))
        piece = await gen.collect()  # closes the generation however it ends; an APIError becomes its response
        return JSONResponse(completion_body(rid, model.name, piece.text, piece.finish_reason, piece.usage, chat))

    @app.get("/health")
    async def health():
        problems = state.unhealthy()
        if problems:
            return APIError(503, "; ".join(problems), None, "unhealthy").response()
        load = {name: dict(zip(("running", "waiting"), m.counts())) for name, m in state.models.items()}
        return {"status": "ok", "models": list(state.models), "load": load}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def list_models():
        return models_body(list(state.models), state.created)

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest):
        return await run(body, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest):
        return await run(body, chat=True)

    def openapi() -> dict:  # the served model names as examples of `model` (schema-driven clients, fuzzers)
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for name in ("CompletionRequest", "ChatCompletionRequest"):
                schema["components"]["schemas"][name]["properties"]["model"]["examples"] = list(state.models)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    return app

