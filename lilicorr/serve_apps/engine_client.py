"""One served model: an engine thread seen from asyncio.

The engine thread (`lilicorr.engine.threaded.EngineThread`) owns the decoder and runs its step loop; it
calls `on_delta` on its own thread, so deltas cross into the request's event loop through
`loop.call_soon_threadsafe` onto an `asyncio.Queue`. Closing an `EngineStream` early for any
reason (stop string, client gone, cancellation) aborts the request in the engine and frees its slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServedModel:
    name: str  # e.g. "smollm2-135m-lilicorr"
    system: str  # engine system name, e.g. "lilicorr"
    engine: Any  # EngineThread (or anything with submit / abort / alive / stalled)
    max_seq_len: int
    vocab_size: int
    checkpoint: str | None = None
    inflight: dict = field(default_factory=dict)  # request id -> "waiting" | "running"

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests: the engine's own counts where it reports them, else the app's view."""
        dec = getattr(self.engine, "decoder", None)
        if dec is not None and hasattr(dec, "num_running"):  # slots really held, requests really queued
            return int(dec.num_running()), int(dec.num_waiting())
        states = list(self.inflight.values())
        return states.count("running"), states.count("waiting")


class EngineStream:
    """The deltas of one submitted request; `aclose()` (or an early exit) aborts it in the engine."""

    def __init__(self, model: ServedModel, request):
        self.model, self.request = model, request
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        model.engine.submit(request, self._on_delta)  # QueueFull / RequestError propagate to the caller
        model.inflight[request.id] = "waiting"

    def _on_delta(self, delta) -> None:  # engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, delta)
        except RuntimeError:  # the request's loop is gone (server shutting down)
            pass

    def __aiter__(self) -> "EngineStream":
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        delta = await self.queue.get()
        if delta.new_ids:
            self.model.inflight[self.request.id] = "running"
        if delta.finished:
            self.finished = True
            self.model.inflight.pop(self.request.id, None)
        return delta

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request in the engine unless it already finished (idempotent)."""
        self.model.inflight.pop(self.request.id, None)
        if not self.finished:
            self.finished = True
            self.model.engine.abort(self.request.id)
