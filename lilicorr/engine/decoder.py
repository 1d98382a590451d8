"""The step-able batched decoder every job uses: AR or speculative, lossless at any temperature.

    dec = Decoder(target, cfg.engine, drafter=..., head=..., stop_ids=[eos])
    dec.add_request(Request(id=0, prompt_ids=[...]))
    while dec.has_work():
        for result in dec.step(): ...          # finished requests, as they finish
    # or: results = dec.generate([Request(...), ...])

Each of up to `max_batch` rows (slots) holds one sequence. A step admits waiting requests into free
slots (one right-padded prefill per contiguous run of new slots), then runs one block for every live
row: draft (speculative systems), verify in one target pass, accept, commit. Rows accept different
numbers of tokens; the static cache only advances each row's length. AR decoding is the same step
with a block of one node (the anchor) and no drafter.

Invariants: the target cache holds every committed token except the newest (the anchor, which the
next block processes first); the drafter's context has exactly the same length.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from lilicorr.config import EngineConfig

from .candidates import Candidates, ancestor_mask, chain, depths
from .drafting import DraftRunner
from .requests import Request, Result
from .sampling import draw_uniforms, sample_with_uniform, target_probs
from .stats import DecodeStats, StageTimers
from .target_forward import TargetForward
from .verify import verify


PREFILL_TOKENS = 2048  # rows x chunk length of one prefill pass


@dataclass
class _Live:
    index: int  # arrival order
    request: Request
    result: Result
    temperature: float
    max_new: int
    stop: frozenset
    generator: Optional[torch.Generator]
    lens: int = 0  # host mirror of the cache length of its row


class Decoder:
    def __init__(self, target: TargetForward, cfg: EngineConfig, drafter=None, head=None,
                 stop_ids: Iterable[int] = (), timing: bool = False, max_batch: Optional[int] = None):
        self.target, self.cfg = target, cfg
        self.device = target.device
        self.max_batch = max_batch or cfg.max_batch_size
        self.max_len = cfg.max_seq_len
        self.block = drafter.block_size if drafter is not None else 1  # N nodes per verification
        slack = self.block + 1  # a block may write past max_len before its length is checked
        self.cache = target.new_cache(self.max_batch, self.max_len, slack=slack)
        self.draft = (DraftRunner(drafter, head, target, self.max_batch, self.max_len, slack)
                      if drafter is not None else None)
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.slots: list[Optional[_Live]] = [None] * self.max_batch
        self.last_token = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)  # (C_max,) anchors
        self.temps = torch.zeros(self.max_batch, dtype=torch.float32, device=self.device)
        self.waiting: deque[_Live] = deque()
        self.finished: list[Result] = []
        self.stats = DecodeStats(block_size=self.block)
        self.timers = StageTimers(timing, self.device)
        self.head_generator = torch.Generator(self.device).manual_seed(cfg.seed)
        self._arrivals = 0
        self._graphs = None
        if self.device.type == "cuda" and cfg.cuda_graphs:
            from .cuda_graphs import GraphedSteps
            self._graphs = GraphedSteps(self)

    # ------------------------------------------------------------------ requests in / results out

    def add_request(self, req: Request) -> None:
        """Queue a request. A bad one finishes at once with `error` set; it never stops the others."""
        index, self._arrivals = self._arrivals, self._arrivals + 1
        result = Result(id=req.id, prompt_ids=list(req.prompt_ids or []), index=index)
        error = self._check(req)
        if error:
            result.finish_reason, result.error = "error", f"request {req.id!r}: {error}"
            self.finished.append(result)
            return
        temp = self.cfg.temperature if req.temperature is None else float(req.temperature)
        max_new = self.cfg.max_new_tokens if req.max_new_tokens is None else int(req.max_new_tokens)
        max_new = min(max_new, self.max_len - len(req.prompt_ids))  # the cache bounds prompt + output
        gen = None
        if temp > 0:
            seed = req.seed if req.seed is not None else self.cfg.seed * 1_000_003 + index
            gen = torch.Generator(self.device).manual_seed(int(seed))
        stop = self.stop_ids if req.stop_ids is None else frozenset(int(t) for t in req.stop_ids)
        self.waiting.append(_Live(index, req, result, temp, max_new, stop, gen))

    def _check(self, req: Request) -> Optional[str]:
        ids = req.prompt_ids
        if ids is None or len(ids) == 0:
            return "empty prompt"
        if len(ids) >= self.max_len:
            return f"prompt of {len(ids)} tokens does not fit the cache (engine.max_seq_len={self.max_len})"
        bad = [t for t in ids if not (0 <= int(t) < self.target.vocab_size)]
        if bad:
            return f"token id {bad[0]} outside the vocabulary (size {self.target.vocab_size})"
        if req.temperature is not None and req.temperature < 0:
            return f"temperature {req.temperature} < 0"
        if req.max_new_tokens is not None and req.max_new_tokens < 1:
            return f"max_new_tokens {req.max_new_tokens} < 1"
        return None

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots) or bool(self.finished)

    def generate(self, requests: list[Request], progress: bool = False) -> list[Result]:
        """Run requests to completion; results in input order."""
        first = self._arrivals
        for r in requests:
            self.add_request(r)
        done: dict[int, Result] = {}
        while self.has_work():
            for res in self.step():
                done[res.index] = res
                if progress:
                    print(f"[generate] {len(done)}/{len(requests)} done", file=sys.stderr, flush=True)
        return [done[first + i] for i in range(len(requests))]

    # ------------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self) -> list[Result]:
        t0 = time.perf_counter()
        self._admit()
        active = [s for s, live in enumerate(self.slots) if live is not None]
        if active:
            self._block(active)
        self.stats.wall_s += time.perf_counter() - t0
        out, self.finished = self.finished, []
        return out

    def _admit(self) -> None:
        free = [s for s, live in enumerate(self.slots) if live is None]
        taken = []
        for s in free:
            if not self.waiting:
                break
            self.slots[s] = self.waiting.popleft()
            taken.append(s)
        if taken:
            self._prefill(taken)

    def _prefill(self, slots: list[int]) -> None:
        """All new sequences in one right-padded pass on a scratch cache, then copied into their slots.

        Right padding is exact: causal attention keeps real tokens from seeing the pads after them,
        and the pads' cache entries lie beyond each row's length.
        """
        lives = [self.slots[s] for s in slots]
        lengths = [len(l.request.prompt_ids) for l in lives]
        t = max(lengths)
        tokens = torch.zeros(len(slots), t, dtype=torch.long)
        for i, l in enumerate(lives):
            tokens[i, :lengths[i]] = torch.tensor(l.request.prompt_ids, dtype=torch.long)
        tokens = tokens.to(self.device)
        idx = torch.tensor(slots, device=self.device)
        last = torch.tensor(lengths, device=self.device) - 1  # (C,) each row's last prompt position
        c = len(slots)
        scratch = self.target.new_cache(c, t, slack=0)
        # Chunks of ~PREFILL_TOKENS tokens bound the attention scores' memory for long prompts.
        chunk = max(8, PREFILL_TOKENS // c)
        logits = None
        captured = []
        for a in range(0, t, chunk):
            b = min(t, a + chunk)
            at = (last - a).clamp(0, b - a - 1)  # (C,) the last prompt position, where it is in this chunk
            out = self.target(tokens[:, a:b], scratch, slice(0, c), kv_len=b, logits_at=at[:, None],
                              want_captured=self.draft is not None)
            scratch.lens[:c] += b - a
            here = ((last >= a) & (last < b))[:, None, None]
            logits = out.logits if logits is None else torch.where(here, out.logits, logits)
            if self.draft is not None:
                captured.append(out.captured)
        self.cache.load_rows(idx, scratch, t)
        self.cache.lens[idx] = last + 1
        if self.draft is not None:
            self.draft.prefill_context(idx, torch.cat(captured, dim=1), last)
        temps = torch.tensor([l.temperature for l in lives], dtype=torch.float32, device=self.device)
        self.temps[idx] = temps
        p = target_probs(logits, temps, self.cfg.top_k, self.cfg.top_p)[:, 0]  # (C, V)
        u = draw_uniforms([l.generator for l in lives], (1, 2), self.device)  # (C, 1, 2)
        first = sample_with_uniform(p, u[:, 0, 1])
        self.last_token[idx] = first
        self.stats.prefill_tokens += sum(lengths)
        for s, l, n, tok in zip(slots, lives, lengths, first.tolist()):
            l.lens = n
            self._emit(s, l, [tok])

    def _block(self, active: list[int]) -> None:
        n_rows = active[-1] + 1
        if self._graphs is not None:
            n_rows = self.max_batch  # static shapes: every slot, every step
        rows = slice(0, n_rows)
        live = [self.slots[s] for s in range(n_rows)]
        alive = torch.tensor([l is not None for l in live], device=self.device)  # (C,)
        lens = self.cache.lens[rows].clone()  # (C,) before this block
        anchor = self.last_token[rows]  # (C,)
        host_lens = [l.lens if l is not None else 0 for l in live]
        kv_len = self.cache.capacity if self._graphs is not None else max(host_lens) + self.block
        q = None
        if self.draft is None:
            cands = Candidates(tokens=anchor[:, None], parents=torch.full((n_rows, 1), -1, device=self.device),
                               num_nodes=torch.ones(n_rows, dtype=torch.long, device=self.device))
        else:
            ctx_len = self.cache.capacity if self._graphs is not None else max(host_lens)
            proposal = self.draft.propose(rows, anchor, lens, ctx_len, self.timers,
                                          temperature=self.cfg.temperature, generator=self.head_generator,
                                          graphs=self._graphs)
            # Never propose past a row's token budget or its cache: a block commits accepted + 1.
            budget = [0 if l is None else min(self.block - 1, l.max_new - len(l.result.output_ids) - 1,
                                               self.max_len - l.lens - 1) for l in live]
            allowed = torch.tensor(budget, dtype=torch.long, device=self.device)
            num_proposed = torch.minimum(proposal.num_proposed.to(torch.long), allowed).clamp_min(0)
            cands = chain(anchor, proposal.tokens.to(torch.long), num_proposed)
            if proposal.q_probs is not None:
                qp = proposal.q_probs.float()
                q = torch.cat([torch.zeros_like(qp[:, :1]), qp], dim=1)  # (C, N, V) node-indexed
        tree = not cands.is_chain
        with self.timers.stage("target_verify"):
            if self._graphs is not None and not tree:
                out = self._graphs.verify(cands.tokens)
            else:
                out = self.target(cands.tokens, self.cache, rows, kv_len,
                                  node_depth=depths(cands.parents) if tree else None,
                                  tree_mask=ancestor_mask(cands.parents) if tree else None,
                                  want_captured=self.draft is not None)
        with self.timers.stage("accept_residual"):
            p = target_probs(out.logits, self.temps[rows], self.cfg.top_k, self.cfg.top_p)  # (C, N, V)
            u = draw_uniforms([l.generator if l is not None else None for l in live], (cands.size, 2), self.device)
            verdict = verify(p, cands, u, q)
            accepted = verdict.num_accepted * alive  # (C,)
            if tree:
                self.cache.compact(rows, lens, verdict.path)
            self.cache.lens[rows] = lens + (1 + accepted) * alive
            self.last_token[rows] = torch.where(alive, verdict.next_token, anchor)
            path_tokens = cands.tokens.gather(1, verdict.path)  # (C, N) tokens along the accepted path
        if self.draft is not None:
            with self.timers.stage("draft_backbone"):  # extending the drafter's context is drafter work
                captured = out.captured
                if tree:
                    captured = captured.gather(1, verdict.path[:, :, None].expand(-1, -1, captured.shape[-1]))
                self.draft.commit_context(rows, lens, captured, accepted)
        acc, toks, nxt = accepted.tolist(), path_tokens.tolist(), verdict.next_token.tolist()
        proposed = cands.num_nodes.tolist()
        for s in active:
            l = live[s]
            l.lens += 1 + acc[s]
            l.result.blocks += 1
            l.result.accepted_tokens += acc[s]
            self.stats.record_blocks([acc[s]], [proposed[s] - 1])
            self._emit(s, l, toks[s][1:1 + acc[s]] + [nxt[s]])

    def _emit(self, slot: int, live: _Live, tokens: list[int]) -> None:
        out = live.result.output_ids
        for t in tokens:
            out.append(t)
            self.stats.generated += 1
            if t in live.stop:
                live.result.finish_reason = "stop"
                break
            if len(out) >= live.max_new:
                live.result.finish_reason = "length"
                break
        if live.result.finish_reason:
            self.finished.append(live.result)
            self.slots[slot] = None
            self.cache.lens[slot] = 0
