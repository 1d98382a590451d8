"""EngineThread: one daemon thread owns a Decoder and runs its step loop; any thread submits and aborts.

Contract (the Serve app codes against it; final):

    dec = systems.build_decoder(cfg, hf_model, system, checkpoint=None, stop_ids=(eos,))
    tt = TorchThread(num_threads)              # optional: one per process, shared by its engines
    tt.run(dec.warmup)                         # optional, before start(): compile / graph capture
    et = EngineThread(dec, torch_thread=tt)
    et.start()
    et.submit(req: Request, on_delta: Callable[[Delta], None]) -> None
        thread-safe; raises RequestError (bad request, or its id already in flight) or QueueFull
        (engine.max_waiting requests already waiting) synchronously, RuntimeError once stopped or dead.
        on_delta is called from the engine thread: once per step in which the request gained tokens
        (Delta.new_ids), and exactly once with finished=True (finish_reason "stop" | "length" | "abort"
        | "error", result set; new_ids may hold the last tokens). Bridge into asyncio with
        loop.call_soon_threadsafe. An exception raised by on_delta is logged and ignored.
    et.abort(request_id) -> bool    thread-safe; True when the id was in flight. The request finishes
        before the next block with finish_reason "abort" (its final Delta still arrives).
    et.alive -> bool                the step loop's thread is running
    et.last_step_time -> float      time.monotonic() when the loop last finished a step (or idled)
    et.stalled(timeout_s) -> bool   True when the loop died, or has work and finished no step for timeout_s
    et.stop(timeout_s=10.0)         ends the loop; requests still in flight get a final "abort" Delta
Every engine's torch work (its decoder's steps, and `warmup` through `TorchThread.run`) runs on one shared
`TorchThread`, so a process with several engines runs its intra-op parallel regions from one thread: libgomp
(PyTorch's OpenMP on Linux) stops spin-waiting between regions once its threads outnumber the cores, and then
every region of every thread pays a futex wake. A second thread that had run torch made a decoder much slower
(docs/results.md, "One client through the Serve app"). The thread that builds the decoders should itself run at
one intra-op thread (loading.py does), for the same reason.
Idle, the loop sleeps on a condition (no busy wait). A step that raises (beyond the decoder's own
per-request isolation) fails the requests in flight with "error"; three in a row end the loop, so a
health check (alive / stalled) restarts the replica.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch

from .requests import Delta, QueueFull, Request, RequestError, Result

MAX_CONSECUTIVE_STEP_FAILURES = 3


def _log(msg: str) -> None:
    print(f"[engine thread] {msg}", file=sys.stderr, flush=True)


class TorchThread:
    """One thread that runs every callable given to `run`, in order, at `num_threads` intra-op threads: the only
    thread of the process whose torch ops open parallel regions (see the module docstring)."""

    def __init__(self, num_threads: int, name: str = "lilicorr-torch"):
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                        initializer=torch.set_num_threads, initargs=(num_threads,))

    def run(self, fn: Callable[..., Any], *args) -> Any:
        """fn(*args) on the torch thread; blocks until it returns (or raises its exception here)."""
        return self._pool.submit(fn, *args).result()


class EngineThread:
    def __init__(self, decoder, name: str = "lilicorr-engine", torch_thread: Optional[TorchThread] = None):
        """torch_thread: where the decoder's steps run (shared by the engines of one process); None = this
        engine's own loop thread."""
        self.decoder = decoder
        self.torch_thread = torch_thread
        self._cond = threading.Condition()
        self._inbox: list[Request] = []
        self._aborts: list[Any] = []
        self._callbacks: dict[Any, Callable[[Delta], None]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self.last_step_time = time.monotonic()
        self.error: Optional[BaseException] = None  # what ended the loop, if it died

    # ------------------------------------------------------------------ other threads

    def start(self) -> "EngineThread":
        self._started = True
        self.last_step_time = time.monotonic()
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stalled(self, timeout_s: float) -> bool:
        if self._started and not self.alive:
            return True
        with self._cond:
            busy = bool(self._callbacks)
        return busy and time.monotonic() - self.last_step_time > timeout_s

    def submit(self, req: Request, on_delta: Callable[[Delta], None]) -> None:
        self.decoder.validate(req)
        with self._cond:
            if self._stopping or (self._started and not self.alive):
                raise RuntimeError("the engine thread is not running")
            if req.id in self._callbacks:
                raise RequestError(f"request {req.id!r}: id already in flight")
            limit = self.decoder.cfg.max_waiting
            if len(self._inbox) + self.decoder.num_waiting() >= limit:
                raise QueueFull(f"{limit} requests waiting (engine.max_waiting={limit})")
            self._inbox.append(req)
            self._callbacks[req.id] = on_delta
            self._cond.notify()

    def abort(self, request_id: Any) -> bool:
        with self._cond:
            if request_id not in self._callbacks:
                return False
            self._aborts.append(request_id)
            self._cond.notify()
            return True

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._started:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        failures = 0
        dec = self.decoder
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self._aborts or dec.has_work()):
                    self.last_step_time = time.monotonic()
                    self._cond.wait(timeout=1.0)
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            deltas: list[Delta] = []
            for req in inbox:
                try:
                    dec.add_request(req)
                except Exception as e:  # noqa: BLE001 - QueueFull cannot happen (submit bounds it); be safe
                    deltas.append(self._error_delta(req.id, e))
            for rid in aborts:
                dec.abort(rid)
            try:
                deltas += dec.step_deltas() if self.torch_thread is None else self.torch_thread.run(dec.step_deltas)
                failures = 0
            except Exception as e:  # noqa: BLE001
                failures += 1
                _log(f"step failed ({failures} in a row): {traceback.format_exc()}")
                deltas += self._fail_in_flight(e, "error")
                if failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                    self.error = e
                    self._deliver(deltas)
                    break
            self.last_step_time = time.monotonic()
            self._deliver(deltas)
        with self._cond:
            self._stopping = True
        self._deliver(self._fail_in_flight(self.error, "error" if self.error else "abort"))

    def _error_delta(self, rid: Any, e: Optional[BaseException], reason: str = "error") -> Delta:
        msg = None if e is None else f"request {rid!r}: {type(e).__name__}: {e}"
        return Delta(rid, [], True, reason, Result(id=rid, prompt_ids=[], finish_reason=reason, error=msg))

    def _fail_in_flight(self, e: Optional[BaseException], reason: str) -> list[Delta]:
        """Final deltas for every request in flight, with what it generated so far; the decoder's slots
        and queue are freed."""
        with self._cond:
            ids = list(self._callbacks)
            self._inbox, self._aborts = [], []
        out: dict[Any, Delta] = {}
        try:
            for rid in ids:
                self.decoder.abort(rid)
            out = {d.id: d for d in self.decoder.pending_deltas() if d.finished}
        except Exception:  # noqa: BLE001 - the decoder may be what broke
            pass
        deltas = []
        for rid in ids:
            d = out.get(rid) or self._error_delta(rid, e, reason)
            d.finish_reason = d.result.finish_reason = reason
            if e is not None:
                d.result.error = f"request {rid!r}: {type(e).__name__}: {e}"
            deltas.append(d)
        return deltas

    def _deliver(self, deltas: list[Delta]) -> None:
        for d in deltas:
            with self._cond:
                cb = self._callbacks.pop(d.id, None) if d.finished else self._callbacks.get(d.id)
            if cb is None:
                continue
            try:
                cb(d)
            except Exception:  # noqa: BLE001 - a client's callback never stops the engine
                _log(f"on_delta for {d.id!r} raised: {traceback.format_exc()}")
