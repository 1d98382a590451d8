"""One generation: an engine request + stop strings in, text pieces + finish reason + usage out.

`Generation.start()` submits to the engine at once, so a full queue (429) or a refused request (400)
is known before any HTTP response starts. The engine thread (`lilicorr.engine.threaded.EngineThread`) owns the
decoder and calls back on its own thread, so each delta crosses into the request's event loop through
`loop.call_soon_threadsafe` onto an `asyncio.Queue`. Iterating yields `Piece`s; the last one carries the finish
reason and the usage. Closing early for any reason (stop string, client gone, cancellation) aborts the request
in the engine and frees its slot.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

from lilicorr.engine.requests import QueueFull, Request, RequestError

from .detok import TextStream
from .errors import APIError
from .metrics import NULL_METRICS
from .protocol import usage

RETRY_AFTER_S = 1


@dataclass
class ServedModel:
    name: str  # e.g. "smollm2-135m-lilicorr"
    engine: Any  # EngineThread (or anything with submit / abort / alive / stalled / decoder)
    max_seq_len: int
    vocab_size: int

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests: slots the decoder really holds, requests it really queues."""
        decoder = self.engine.decoder
        return int(decoder.num_running()), int(decoder.num_waiting())


@dataclass
class Piece:
    text: str
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None


class Generation:
    def __init__(self, model: ServedModel, tokenizer, request: Request, stops: Sequence[str] = (),
                 metrics=NULL_METRICS):
        self.model, self.tokenizer, self.request, self.stops, self.metrics = model, tokenizer, request, stops, metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.perf_counter()
        self.first_at: Optional[float] = None
        self.tokens = 0
        self.deltas = 0
        self.finished = False  # the engine sent the last delta, or the request was aborted there
        self.done = False  # the outcome is counted in the metrics

    def start(self) -> "Generation":
        loop = asyncio.get_running_loop()

        def on_delta(delta) -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, delta)
            except RuntimeError:  # the request's loop is gone (server shutting down)
                pass

        try:
            self.model.engine.submit(self.request, on_delta)
        except QueueFull as e:
            err = APIError(429, f"server busy: {e}", None, "queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
        except RequestError as e:
            err = APIError(400, str(e), None, "invalid_request")
        except RuntimeError as e:  # the engine thread stopped or died: check_health replaces the replica
            err = APIError(503, f"engine unavailable: {e}", None, "engine_unavailable")
        else:
            self._depth()
            return self
        self.metrics.request_done(self.model.name, str(err.status))
        raise err

    def _depth(self) -> None:
        self.metrics.queue_depth(self.model.name, *self.model.counts())

    def _abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.model.engine.abort(self.request.id)

    def close(self) -> None:
        """Abort in the engine unless finished; idempotent. A generation closed unfinished counts as 499."""
        self._abort()
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
        return usage(len(self.request.prompt_ids), self.tokens, blocks, accepted)

    def _finish(self, status: str, use: Optional[dict] = None) -> None:
        name = self.model.name
        self.done = True
        self.metrics.request_done(name, status)
        if self.first_at is not None:
            self.metrics.ttft(name, self.first_at - self.t0)
            if self.tokens > 1:
                self.metrics.tpot(name, (time.perf_counter() - self.first_at) / (self.tokens - 1))
        if use and use["blocks"]:
            self.metrics.accepted_per_block(name, use["tau"])

    async def pieces(self) -> AsyncIterator[Piece]:
        text = TextStream(self.tokenizer, self.stops)
        try:
            while not self.finished:
                delta = await self.queue.get()
                self.finished = self.finished or delta.finished  # an abort while waiting stays an abort
                if delta.new_ids:
                    self.deltas += 1
                    self.tokens += len(delta.new_ids)
                    if self.first_at is None:
                        self.first_at = time.perf_counter()
                piece = text.add(delta.new_ids, final=delta.finished)
                if text.stopped:  # a stop string: cut here and free the slot now
                    self._abort()
                    use = self._usage(None)
                    self._finish("200", use)
                    yield Piece(piece, "stop", use)
                    return
                if delta.finished:
                    result = delta.result
                    if delta.finish_reason == "error" or (result is not None and result.error):
                        self._finish("500")
                        err = result.error if result is not None else "engine error"
                        raise APIError(500, f"generation failed: {err}", None, "engine_error")
                    if delta.finish_reason == "abort":  # not ours: the engine is shutting down
                        self._finish("503")
                        raise APIError(503, "request aborted by the server (shutting down)", None, "aborted")
                    use = self._usage(result)
                    self._finish("200", use)
                    reason = "length" if delta.finish_reason == "length" else "stop"
                    yield Piece(piece, reason, use)
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
