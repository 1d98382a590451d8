"""The scheduler: requests, slots, admission, the waiting queue, and what each step emits.

    dec = Decoder(target, cfg.engine, drafter=..., head=..., stop_ids=[eos])
    dec.add_request(Request(id=0, prompt_ids=[...]))    # QueueFull past engine.max_waiting
    while dec.has_work():
        for delta in dec.step_deltas(): ...            # tokens gained / finished, per request
    # or: dec.step() -> finished [Result]; or: results = dec.generate([Request(...), ...])

Each of up to `max_batch` slots holds one sequence. A step (1) admits waiting requests into free
slots, (2) prefills at most engine.prefill_token_budget prompt tokens, oldest request first (a long
prompt spans steps), and (3) runs one block (runner.py) for every slot whose prompt is in, so running
streams never wait for a prefill to finish. A request that raises fails alone: a failed batched pass
is retried row by row and only the rows that fail by themselves finish with finish_reason "error".
"""

from __future__ import annotations

import math
import operator
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from lilicorr.config import EngineConfig
from lilicorr.kernels.dispatch import triton_scope

from . import runner as runner_module
from .requests import Delta, QueueFull, Request, RequestError, Result
from .runner import ModelRunner, SlotSampling
from .stats import DecodeStats
from .target_forward import TargetForward


@dataclass
class _Live:
    index: int  # arrival order
    request: Request
    result: Result
    sampling: SlotSampling
    max_new: int
    stop: frozenset
    slot: Optional[int] = None
    prefilled: int = 0  # prompt tokens in the cache
    running: bool = False  # prompt fully prefilled: decodes each step
    lens: int = 0  # host mirror of the row's cache length once running
    sent: int = 0  # output tokens already handed out in deltas


class Decoder:
    def __init__(self, target: TargetForward, cfg: EngineConfig, drafter=None, head=None,
                 stop_ids: Iterable[int] = (), timing: bool = False, max_batch: Optional[int] = None, plan=None):
        # plan: backend.BackendPlan (systems.py resolves it; None = the runner's defaults, as before it existed)
        self.runner = ModelRunner(target, cfg, drafter, head, timing=timing, max_batch=max_batch, plan=plan)
        self.backend_plan = plan
        # Triton kernels in this decoder's steps only as its plan says (kernels/dispatch.py: a scope, not a global)
        self._triton = plan is None or plan.kernels == "triton"
        self.cfg = cfg
        self.max_batch, self.max_len, self.block = self.runner.max_batch, self.runner.max_len, self.runner.block
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.slots: list[Optional[_Live]] = [None] * self.max_batch
        self.waiting: deque[_Live] = deque()
        self.finished: list[_Live] = []  # finished since the last step's deltas
        self.stats = DecodeStats(block_size=self.block)
        self._arrivals = 0

    # the runner's parts, for callers and tests
    target = property(lambda self: self.runner.target)
    device = property(lambda self: self.runner.device)
    timers = property(lambda self: self.runner.timers)
    draft = property(lambda self: self.runner.drafting)

    # ------------------------------------------------------------------ requests in

    def validate(self, req: Request) -> None:
        """Raise RequestError naming the request and the problem, or return (thread-safe: reads no state)."""
        error = self._check(req)
        if error:
            raise RequestError(f"request {req.id!r}: {error}")

    def _check(self, req: Request) -> Optional[str]:
        ids = req.prompt_ids
        if ids is None or len(ids) == 0:
            return "empty prompt"
        if len(ids) >= self.max_len:
            return f"prompt of {len(ids)} tokens does not fit the cache (engine.max_seq_len={self.max_len})"
        limit = getattr(self.target, "max_positions", None)
        if limit and len(ids) >= limit:
            rope = getattr(getattr(self.target, "config", None), "rope_parameters", None) or {}
            extended = rope.get("rope_type") == "yarn"
            need = (len(ids) + 1) / (rope.get("original_max_position_embeddings", limit) if extended else limit)
            return (f"prompt of {len(ids)} tokens does not fit the target's context of {limit} positions "
                    f"(max_position_embeddings{', YaRN-extended' if extended else ''}): serve it with "
                    f"target.yarn_factor={math.ceil(need)} (YaRN, paper §4.3.1), or shorten the prompt")
        try:
            ids = [operator.index(t) for t in ids]  # ints, NumPy ints, 0-d integer tensors
        except TypeError:
            return "prompt_ids must be integer token ids"
        bad = [t for t in ids if not (0 <= t < self.target.vocab_size)]
        if bad:
            return f"token id {bad[0]} outside the vocabulary (size {self.target.vocab_size})"
        if req.temperature is not None and not req.temperature >= 0:
            return f"temperature {req.temperature} < 0"
        if req.max_new_tokens is not None and req.max_new_tokens < 1:
            return f"max_new_tokens {req.max_new_tokens} < 1"
        if req.top_p is not None and not 0 < req.top_p <= 1:
            return f"top_p {req.top_p} outside (0, 1]"
        if req.top_k is not None and req.top_k < 0:
            return f"top_k {req.top_k} < 0"
        return None

    def add_request(self, req: Request) -> None:
        """Queue a request; QueueFull when engine.max_waiting are already waiting. A bad request finishes
        at once with `error` set (its Delta comes with the next step); it never stops the others."""
        if len(self.waiting) >= self.cfg.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests waiting (engine.max_waiting={self.cfg.max_waiting})")
        self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        index, self._arrivals = self._arrivals, self._arrivals + 1
        result = Result(id=req.id, prompt_ids=list(req.prompt_ids or []), index=index)
        error = self._check(req)
        if error:
            result.finish_reason, result.error = "error", f"request {req.id!r}: {error}"
            self.finished.append(_Live(index, req, result, SlotSampling(0.0, 0, 1.0, None), 0, frozenset()))
            return
        c = self.cfg
        temp = c.temperature if req.temperature is None else float(req.temperature)
        top_k = c.top_k if req.top_k is None else int(req.top_k)
        top_p = c.top_p if req.top_p is None else float(req.top_p)
        max_new = c.max_new_tokens if req.max_new_tokens is None else int(req.max_new_tokens)
        max_new = min(max_new, self.max_len - len(req.prompt_ids))  # the cache bounds prompt + output
        if getattr(self.target, "max_positions", None):  # and so do the target's positions
            max_new = min(max_new, self.target.max_positions - len(req.prompt_ids))
        gen = None
        if temp > 0:
            seed = req.seed if req.seed is not None else c.seed * 1_000_003 + index
            gen = torch.Generator(self.device).manual_seed(int(seed))
        stop = self.stop_ids if req.stop_ids is None else frozenset(int(t) for t in req.stop_ids)
        self.waiting.append(_Live(index, req, result, SlotSampling(temp, top_k, top_p, gen), max_new, stop))

    def abort(self, request_id: Any) -> bool:
        """Finish a waiting or running request now (finish_reason "abort"), freeing its slot before the
        next block. False when no such request is queued or running."""
        for live in self.waiting:
            if live.request.id == request_id:
                self.waiting.remove(live)
                self._finish(live, "abort")
                return True
        for live in self.slots:
            if live is not None and live.request.id == request_id:
                self._finish(live, "abort")
                return True
        return False

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return sum(live is not None for live in self.slots)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots) or bool(self.finished)

    # ------------------------------------------------------------------ results out

    def generate(self, requests: list[Request], progress: bool = False) -> list[Result]:
        """Run requests to completion (not bounded by max_waiting); results in input order."""
        first = self._arrivals
        for r in requests:
            self._enqueue(r)
        done: dict[int, Result] = {}
        while self.has_work():
            for res in self.step():
                done[res.index] = res
                if progress:
                    print(f"[generate] {len(done)}/{len(requests)} done", file=sys.stderr, flush=True)
        return [done[first + i] for i in range(len(requests))]

    def step(self) -> list[Result]:
        """One step; the requests that finished in it."""
        return [d.result for d in self.step_deltas() if d.finished]

    @torch.no_grad()
    def step_deltas(self) -> list[Delta]:
        """One step (admission, prefill within the token budget, one block); a Delta for every request
        that gained tokens or finished."""
        t0 = time.perf_counter()
        with triton_scope(self._triton):
            self._admit()
            self._prefill_step()
            running = [s for s, live in enumerate(self.slots) if live is not None and live.running]
            if running:
                self._block(running)
        self.stats.wall_s += time.perf_counter() - t0
        return self.pending_deltas()

    def pending_deltas(self) -> list[Delta]:
        """The deltas not handed out yet, without running a step (e.g. after abort())."""
        out = []
        for live in self.slots:
            if live is not None and len(live.result.output_ids) > live.sent:
                out.append(Delta(live.request.id, live.result.output_ids[live.sent:], False))
                live.sent = len(live.result.output_ids)
        for live in self.finished:
            r = live.result
            out.append(Delta(r.id, r.output_ids[live.sent:], True, r.finish_reason, r))
            live.sent = len(r.output_ids)
        self.finished = []
        return out

    def warmup(self) -> None:
        """Run greedy and sampled requests through prefill and every block path (Triton compile, CUDA
        graph capture, the C head's build) so the first real request does not pay for it; statistics
        start afresh after.

        A greedy request alone first: one live row is the path of every batch-1 request. Then a pair whose
        sampled request runs longer, so one row also decodes alone in another cache slot.
        """
        if self.has_work():
            raise RuntimeError("warmup() needs an idle decoder")
        arrivals = self._arrivals
        prompt = [0] * min(4, self.max_len - 1)
        n = min(self.block + 2, self.max_len - len(prompt))  # the first token, then at least one full block
        self.generate([Request("__warmup_alone__", prompt, max_new_tokens=n, temperature=0.0, stop_ids=[])])
        longer = min(2 * n, self.max_len - len(prompt))
        self.generate([Request("__warmup_greedy__", prompt, max_new_tokens=n, temperature=0.0, stop_ids=[]),
                       Request("__warmup_sampled__", prompt, max_new_tokens=longer, temperature=1.0, seed=0,
                               stop_ids=[])])
        self._arrivals = arrivals  # default seeds stay those of a fresh decoder
        self.runner.head_generator.manual_seed(self.cfg.seed)
        self.stats = DecodeStats(block_size=self.block)
        self.runner.timers.__init__(self.runner.timers.enabled, self.device)

    # ------------------------------------------------------------------ one step's parts

    def _finish(self, live: _Live, reason: str, error: Optional[str] = None) -> None:
        live.result.finish_reason = reason
        if error is not None:
            live.result.error = error
        if live.slot is not None:
            self.slots[live.slot] = None
            self.runner.close_slot(live.slot)
            live.slot = None
        self.finished.append(live)

    def _fail(self, live: _Live, e: BaseException) -> None:
        self._finish(live, "error", f"request {live.request.id!r}: {type(e).__name__}: {e}")

    def _admit(self) -> None:
        for s in range(self.max_batch):
            if not self.waiting:
                break
            if self.slots[s] is None:
                live = self.waiting.popleft()
                live.slot = s
                self.slots[s] = live
                self.runner.open_slot(s, live.sampling, len(live.request.prompt_ids), live.max_new)

    def _prefill_step(self) -> None:
        pending = sorted((live for live in self.slots if live is not None and not live.running),
                         key=lambda live: live.index)
        budget = self.cfg.prefill_token_budget or float("inf")
        plan = []
        for live in pending:
            if budget <= 0:
                break
            n = int(min(len(live.request.prompt_ids) - live.prefilled, budget, runner_module.PREFILL_TOKENS))
            plan.append((live, n))
            budget -= n
        if not plan:
            return

        def run(items):
            return self.runner.prefill([live.slot for live, _ in items],
                                       [live.request.prompt_ids[live.prefilled:live.prefilled + n] for live, n in items],
                                       [live.prefilled for live, _ in items],
                                       [live.prefilled + n == len(live.request.prompt_ids) for live, n in items])

        for (live, n), first in self._guarded(plan, run):
            live.prefilled += n
            self.stats.prefill_tokens += n
            if first is not None:
                live.running, live.lens = True, live.prefilled
                self._emit(live, [first])

    def _block(self, running: list[int]) -> None:
        graphs = self.runner.graphs
        rows = graphs.rows if graphs is not None else slice(running[0], running[-1] + 1)

        lives = self.slots[rows]
        try:
            out = self.runner.run_block(rows, max(l.lens for l in lives if l is not None and l.running))
            done = [(l, out, i) for i, l in enumerate(lives) if l is not None and l.running]
        except Exception:  # noqa: BLE001 - isolate: every row alone, eagerly; only failing rows fail
            done = []
            for live in [l for l in lives if l is not None and l.running]:
                s = live.slot
                self.stats.eager_retries += 1
                try:
                    one = self.runner.run_block(slice(s, s + 1), live.lens, eager=True)
                    done.append((live, one, 0))
                except Exception as e:  # noqa: BLE001
                    self._fail(live, e)
        for live, out, i in done:
            acc = out.accepted[i]
            live.lens += 1 + acc
            live.result.blocks += 1
            live.result.accepted_tokens += acc
            self.stats.record_blocks([acc], [out.proposed[i]])
            self._emit(live, out.tokens[i])

    def _guarded(self, items: list, run) -> list:
        """[(item, output)] of run(items) -> outputs; on an exception, each item alone, failing those that raise."""
        try:
            return list(zip(items, run(items)))
        except Exception:  # noqa: BLE001
            ok = []
            for item in items:
                try:
                    ok.append((item, run([item])[0]))
                except Exception as e:  # noqa: BLE001
                    self._fail(item[0], e)
            return ok

    def _emit(self, live: _Live, tokens: list[int]) -> None:
        out = live.result.output_ids
        for t in tokens:
            out.append(t)
            self.stats.generated += 1
            if t in live.stop:
                self._finish(live, "stop")
                return
            if len(out) >= live.max_new:
                self._finish(live, "length")
                return
