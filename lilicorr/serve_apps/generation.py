"""One generation: prompt ids + sampling parameters in, text pieces + finish reason + usage out.

`Generation.start()` submits to the engine at once, so a full queue (429) or a refused request (400)
is known before any HTTP response starts. Iterating yields `Piece`s; the last one carries the finish
reason and the usage. A stop string ends the generation and aborts the request in the engine.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from .detok import TextStream
from .engine_client import EngineStream, ServedModel
from .errors import APIError
from .metrics import NULL_METRICS
from .protocol import usage

RETRY_AFTER_S = 1


@dataclass
class Params:
    max_new_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stops: tuple[str, ...] = ()


@dataclass
class Piece:
    text: str
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None


def _engine_request(rid: str, prompt_ids: list[int], p: Params):
    from lilicorr.engine.requests import Request

    kwargs = dict(max_new_tokens=p.max_new_tokens, temperature=p.temperature, seed=p.seed)
    if p.top_p is not None:
        kwargs["top_p"] = p.top_p
    if p.top_k is not None and p.top_k > 0:
        kwargs["top_k"] = p.top_k
    return Request(rid, list(prompt_ids), **kwargs)


class Generation:
    def __init__(self, model: ServedModel, tokenizer, prompt_ids: list[int], params: Params, metrics=NULL_METRICS):
        self.model, self.tokenizer, self.params, self.metrics = model, tokenizer, params, metrics
        self.prompt_ids = list(prompt_ids)
        self.id = uuid.uuid4().hex
        self.stream: Optional[EngineStream] = None
        self.t0 = time.perf_counter()
        self.first_at: Optional[float] = None
        self.tokens = 0
        self.deltas = 0
        self.done = False

    def start(self) -> "Generation":
        from lilicorr.engine.requests import QueueFull, RequestError

        try:
            self.stream = EngineStream(self.model, _engine_request(self.id, self.prompt_ids, self.params))
        except QueueFull as e:
            self.metrics.request_done(self.model.name, "429")
            raise APIError(429, f"server busy: {e}", None, "queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except RequestError as e:
            self.metrics.request_done(self.model.name, "400")
            raise APIError(400, str(e), None, "invalid_request") from None
        except RuntimeError as e:  # the engine thread stopped or died: check_health replaces the replica
            self.metrics.request_done(self.model.name, "503")
            raise APIError(503, f"engine unavailable: {e}", None, "engine_unavailable") from None
        self._depth()
        return self

    def _depth(self) -> None:
        self.metrics.queue_depth(self.model.name, *self.model.counts())

    def close(self) -> None:
        """Abort in the engine unless finished; idempotent. A generation closed unfinished counts as 499."""
        if self.stream is not None:
            self.stream.close()
        if not self.done:
            self.done = True
            self.metrics.request_done(self.model.name, "499")
        self._depth()

    def _usage(self, result) -> dict:
        if result is not None:  # the engine's own counts
            blocks, accepted = result.blocks, result.accepted_tokens
        else:  # stopped early: one delta per block after the prefill's first token
            blocks = max(0, self.deltas - 1)
            accepted = max(0, self.tokens - 1 - blocks)
        return usage(len(self.prompt_ids), self.tokens, blocks, accepted)

    def _finish(self, status: str, use: dict) -> None:
        name = self.model.name
        self.done = True
        self.metrics.request_done(name, status)
        if self.first_at is not None:
            self.metrics.ttft(name, self.first_at - self.t0)
            if self.tokens > 1:
                self.metrics.tpot(name, (time.perf_counter() - self.first_at) / (self.tokens - 1))
        if use["blocks"]:
            self.metrics.accepted_per_block(name, use["tau"])

    async def pieces(self) -> AsyncIterator[Piece]:
        assert self.stream is not None, "start() first"
        text = TextStream(self.tokenizer, self.params.stops)
        try:
            async for delta in self.stream:
                if delta.new_ids:
                    self.deltas += 1
                    self.tokens += len(delta.new_ids)
                    if self.first_at is None:
                        self.first_at = time.perf_counter()
                piece = text.add(delta.new_ids)
                if text.stopped:  # a stop string: cut here and free the slot now
                    self.stream.close()
                    use = self._usage(None)
                    self._finish("200", use)
                    yield Piece(piece, "stop", use)
                    return
                if delta.finished:
                    result = delta.result
                    if delta.finish_reason == "error" or (result is not None and result.error):
                        err = result.error if result is not None else "engine error"
                        self._finish("500", usage(len(self.prompt_ids), self.tokens, 0, 0))
                        raise APIError(500, f"generation failed: {err}", None, "engine_error")
                    if delta.finish_reason == "abort":  # not ours: the engine is shutting down
                        self._finish("503", usage(len(self.prompt_ids), self.tokens, 0, 0))
                        raise APIError(503, "request aborted by the server (shutting down)", None, "aborted")
                    use = self._usage(result)
                    self._finish("200", use)
                    reason = "length" if delta.finish_reason == "length" else "stop"
                    yield Piece(piece + text.finish(), reason, use)
                    return
                if piece:
                    yield Piece(piece)
        finally:
            self.close()  # frees the slot at once if the client went away or the task was cancelled

    async def collect(self) -> Piece:
        """The whole generation as one piece (non-streamed responses)."""
        parts, last = [], Piece("")
        async for piece in self.pieces():
            parts.append(piece.text)
            last = piece
        return Piece("".join(parts), last.finish_reason, last.usage)
