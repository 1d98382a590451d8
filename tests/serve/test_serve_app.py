"""The HTTP app without Ray or a model: FastAPI's TestClient against a scripted engine thread.

The scripted engine answers every prompt with the same known token ids, a few per step on its own
thread (as the real EngineThread calls back), so routes, SSE framing, usage, stop strings, the error
shapes and the status codes are checked exactly and fast.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from lilicorr.engine.requests import QueueFull, RequestError, Result
from lilicorr.serve_apps.app import ServerState, build_app
from lilicorr.serve_apps.generation import ServedModel

ANSWER = "Hello there! General Kenobi. You are a bold one."
MAX_LEN = 64


class ScriptedEngine:
    """Emits `ids` (then EOS): one token (the prefill's), then `chunk` per step (block); refuses with QueueFull past `capacity` requests."""

    def __init__(self, ids: list[int], eos: int, chunk: int = 3, capacity: int = 8, dt: float = 0.001):
        self.ids, self.eos, self.chunk, self.capacity, self.dt = ids, eos, chunk, capacity, dt
        self.alive, self.active, self.aborted, self.seen = True, set(), [], []
        self.lock = threading.Lock()
        self.decoder = SimpleNamespace(num_running=lambda: len(self.active), num_waiting=lambda: 0)  # /health's load

    def stalled(self, timeout_s: float) -> bool:
        return False

    def stop(self) -> None:
        self.alive = False

    def submit(self, req, on_delta) -> None:
        if any(t < 0 for t in req.prompt_ids):
            raise RequestError(f"request {req.id!r}: negative token id")
        with self.lock:
            if len(self.active) >= self.capacity:
                raise QueueFull("waiting queue is full")
            self.active.add(req.id)
            self.seen.append(req)
        threading.Thread(target=self._run, args=(req, on_delta), daemon=True).start()

    def abort(self, rid) -> None:
        with self.lock:
            if rid in self.active:
                self.aborted.append(rid)
                self.active.discard(rid)

    def _run(self, req, on_delta) -> None:
        limit = req.max_new_tokens or 1000
        out = (self.ids + [self.eos])[:limit]
        res = Result(req.id, list(req.prompt_ids))
        pieces = [out[:1]] + [out[i:i + self.chunk] for i in range(1, len(out), self.chunk)]  # prefill, blocks
        for i, piece in enumerate(pieces):
            time.sleep(self.dt)
            with self.lock:
                if req.id not in self.active:
                    return
            res.output_ids += piece
            last = i == len(pieces) - 1
            if i:
                res.blocks += 1
                res.accepted_tokens += len(piece) - 1
            if last:
                res.finish_reason = "stop" if out[-1] == self.eos else "length"
                with self.lock:
                    self.active.discard(req.id)
            on_delta(SimpleNamespace(id=req.id, new_ids=piece, finished=last,
                                     finish_reason=res.finish_reason if last else None, result=res if last else None))


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from lilicorr.platform.assets import smollm2_dir

    return AutoTokenizer.from_pretrained(str(smollm2_dir()))


def _state(tok, capacity=8, api_key=None):
    ids = tok(ANSWER, add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(ids, tok.eos_token_id, capacity=capacity)
    model = ServedModel("tiny-lilicorr", engine, MAX_LEN, len(tok))
    return ServerState({"tiny-lilicorr": model}, tok, api_key=api_key), engine, ids


@pytest.fixture()
def served(tok):
    state, engine, ids = _state(tok)
    with TestClient(build_app(state), raise_server_exceptions=False) as client:
        yield client, engine, ids


def _events(resp) -> list:
    lines = [l for l in resp.text.split("\n") if l]
    assert all(l.startswith("data: ") for l in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(l[6:]) for l in lines[:-1]]


def test_health_and_models(served):
    client, _, _ = served
    assert client.get("/health").json()["status"] == "ok"
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny-lilicorr"]
    schemas = client.get("/openapi.json").json()["components"]["schemas"]  # served names as `model` examples
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["examples"] == ["tiny-lilicorr"]


def test_completion_text_usage_and_tau(served):
    client, engine, ids = served
    r = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": "Hi", "max_tokens": 50})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == ANSWER and body["choices"][0]["finish_reason"] == "stop"
    n = len(ids) + 1  # + EOS
    blocks = -(-(n - 1) // 3)  # the prefill's first token, then blocks of 3
    u = body["usage"]
    assert (u["prompt_tokens"], u["completion_tokens"], u["blocks"]) == (1, n, blocks)
    assert u["tau"] == pytest.approx((n - 1) / blocks)  # every token after the first came from a block
    assert engine.seen[-1].max_new_tokens == 50 and engine.seen[-1].temperature is None


def test_max_tokens_gives_length(served):
    client, _, ids = served
    body = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": [5, 6, 7], "max_tokens": 4}).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("chat", [False, True])
def test_stream_chunks_concatenate_and_end_with_done(served, chat):
    client, _, ids = served
    path, extra = (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}) if chat
                   else ("/v1/completions", {"prompt": "Hi"}))
    r = client.post(path, json={"model": "tiny-lilicorr", "stream": True, "stream_options": {"include_usage": True},
                                **extra})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids) + 1
    chunks = events[:-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    if chat:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == ANSWER and len(chunks) > 3  # streamed in pieces, not one blob


def test_stop_string_cuts_and_aborts_the_engine_request(served):
    client, engine, _ = served
    for stream in (False, True):
        r = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": "Hi", "stop": ["Kenobi"],
                                                 "stream": stream})
        if stream:
            chunks = _events(r)
            text = "".join(c["choices"][0]["text"] for c in chunks)
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        else:
            text = r.json()["choices"][0]["text"]
        assert text == "Hello there! General "
        assert engine.seen[-1].id in engine.aborted  # the slot was freed early


def test_queue_full_is_429_with_retry_after(tok):
    state, engine, _ = _state(tok, capacity=0)
    with TestClient(build_app(state)) as client:
        r = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": "Hi"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_an_engine_error_is_an_openai_shaped_500_whole_or_streamed(served):
    client, engine, _ = served

    def fail(req, on_delta):
        res = Result(req.id, list(req.prompt_ids), finish_reason="error", error="boom")
        on_delta(SimpleNamespace(id=req.id, new_ids=[], finished=True, finish_reason="error", result=res))

    engine._run = fail
    r = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": "Hi"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error" and "boom" in r.text
    r = client.post("/v1/completions", json={"model": "tiny-lilicorr", "prompt": "Hi", "stream": True})
    assert r.status_code == 200 and _events(r)[-1]["error"]["code"] == "engine_error"  # the status was sent


def test_api_key(tok):
    state, _, _ = _state(tok, api_key="s3cret")
    with TestClient(build_app(state)) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        r = client.post("/v1/completions", json={"prompt": "x"})  # auth is checked before the body
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/health").status_code == 200  # probes need no key


def test_unhealthy_engine_is_503(served):
    client, engine, _ = served
    engine.alive = False
    r = client.get("/health")
    assert r.status_code == 503 and "not running" in r.json()["error"]["message"]


C, CH = "/v1/completions", "/v1/chat/completions"
M = {"model": "tiny-lilicorr"}
ERRORS = [
    (C, b"{not json", 400, None),
    (C, b"[1, 2]", 400, None),
    (C, {"prompt": "x"}, 400, "model"),
    (C, M, 400, "prompt"),
    (C, {"model": "nope", "prompt": "x"}, 404, "model"),
    (C, {**M, "prompt": ""}, 400, "prompt"),
    (C, {**M, "prompt": []}, 400, "prompt"),
    (C, {**M, "prompt": "word " * 200}, 400, "prompt"),  # over MAX_LEN tokens
    (C, {**M, "prompt": "x" * 100_000}, 400, "prompt"),
    (C, {**M, "prompt": [1, 10**9]}, 400, "prompt"),
    (C, {**M, "prompt": ["a", "b"]}, 400, "prompt"),
    (C, {**M, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (C, {**M, "prompt": "x", "max_tokens": MAX_LEN}, 400, "max_tokens"),
    (C, {**M, "prompt": "x", "max_tokens": 10**30}, 400, "max_tokens"),
    (C, {**M, "prompt": "x", "temperature": 2.5}, 400, "temperature"),
    (C, {**M, "prompt": "x", "temperature": -0.1}, 400, "temperature"),
    (C, {**M, "prompt": "x", "top_p": 0}, 400, "top_p"),
    (C, {**M, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    (C, {**M, "prompt": "x", "n": 2}, 400, "n"),
    (C, {**M, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (C, {**M, "prompt": "x", "stop": [""]}, 400, "stop"),
    (C, {**M, "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    (C, {**M, "prompt": "x", "echo": True}, 400, "echo"),
    (C, {**M, "prompt": "x", "best_of": 3}, 400, "best_of"),
    (C, {**M, "prompt": "x", "seed": -1}, 400, "seed"),
    (C, {**M, "prompt": "x", "stream": "maybe"}, 400, "stream"),
    (C, {**M, "prompt": [-5]}, 400, "prompt"),
    (CH, {**M, "messages": []}, 400, "messages"),
    (CH, {**M, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    (CH, {**M, "messages": [{"content": "x"}]}, 400, "messages.0.role"),
    (CH, {**M, "messages": "hello"}, 400, "messages"),
    (CH, {**M, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CH, {**M, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools"),
    (CH, {**M, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}, 400, "presence_penalty"),
]


@pytest.mark.parametrize("path,body,status,param", ERRORS, ids=[f"{i}" for i in range(len(ERRORS))])
def test_client_errors_are_openai_shaped_4xx(served, path, body, status, param):
    client, _, _ = served
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param), err


def test_unknown_route_method_and_odd_strings(served):
    client, _, _ = served
    assert client.get("/v1/nothing").status_code == 404
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    # A lone surrogate (valid JSON escape, not encodable UTF-8): 400 or 200, never a 5xx.
    raw = b'{"model": "tiny-lilicorr", "prompt": "a\\ud800b", "stop": "\\udfff"}'
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    r = client.post("/v1/completions", content=b'{"model": "\\ud800", "prompt": "x"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_deployment_check_health_raises_when_the_step_loop_is_gone(tok):
    from lilicorr.serve_apps.deployment import LiLiCorrOpenAI

    cls = LiLiCorrOpenAI.func_or_class
    replica = cls.__new__(cls)  # no __init__: no model load, just the health logic over a state
    replica.state, engine, _ = _state(tok)
    replica.check_health()  # healthy: returns
    engine.stalled = lambda timeout_s: True
    with pytest.raises(RuntimeError, match="stalled"):
        replica.check_health()
    engine.alive = False
    with pytest.raises(RuntimeError, match="not running"):
        replica.check_health()
