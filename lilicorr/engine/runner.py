"""The model runner: what a step does on the model (prefill, draft, verify, commit). No queues, no requests.

The scheduler (scheduler.py) decides which slots run; the runner owns the device state of every slot:
the target's KV cache, the drafter's context (drafting.DraftRunner), each slot's anchor token and its
sampling settings (temperature, top_k, top_p, generator). One block for the rows of a slice:

    proposal = runner.draft(rows, anchor, lens, ctx_len)      # speculative systems only
    out, verdict = runner.verify(rows, cands, q, kv_len)        # one target pass + acceptance
    accepted = runner.commit(rows, lens, cands, out, verdict, alive)
`run_block` chains them and returns host lists. Sync-free: inside a block nothing reads the device
(no .item / .tolist / bool of a tensor); which rows decode and how many drafts each may offer are device
tensors set when a slot opens, finishes its prompt or closes, and the block's results come back in one
copy (pinned, non-blocking on CUDA) at its end. Invariants: the target cache holds every committed
token except the newest (the anchor, which the next block processes first); the drafter's context has
exactly the same length. cuda_graphs.GraphedSteps replays `target_pass` and `draft_backbone` +
`draft_logits` with static shapes (every slot, whole-capacity attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from lilicorr.config import EngineConfig

from . import adaptive_draft
from .candidates import Candidates, ancestor_mask, chain, depths
from .ddtree import tree_depth
from .drafting import DraftRunner
from .sampling import draw_uniforms, sample_with_uniform, target_probs
from .stats import StageTimers
from .target_forward import ForwardOut, TargetForward
from .verify import Verdict
from .verify import verify as verify_candidates
from .verify import verify_greedy

PREFILL_TOKENS = 2048  # tokens of one row's prefill pass (bounds the attention scores' memory)


@dataclass
class SlotSampling:
    temperature: float  # 0 = greedy
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    generator: Optional[torch.Generator]  # None for greedy rows


@dataclass
class BlockOut:
    accepted: list[int]  # per row of the block: accepted draft tokens
    tokens: list[list[int]]  # per row: the committed tokens (accepted drafts, then the next token)
    proposed: list[int]  # per row: draft tokens offered to the verifier


def verified_nodes(cfg: EngineConfig, drafter, head) -> int:
    """Nodes of one verification pass: 1 (AR), a tree head's node count, or 1 + the drafts verified."""
    if drafter is None:
        return 1
    tree_nodes = getattr(head, "num_nodes", None)
    k = cfg.draft_tokens
    if k and tree_nodes:
        raise ValueError("engine.draft_tokens cuts a chain of drafts; a tree head sizes its tree with "
                         "engine.ddtree_budget")
    if not 0 <= k <= drafter.block_size - 1:
        raise ValueError(f"engine.draft_tokens={k}: between 1 and the drafter's block - 1 "
                         f"({drafter.block_size - 1}), or 0 for all")
    adaptive_draft.check(cfg.adaptive_draft_survival, bool(tree_nodes))
    return tree_nodes or 1 + (k or drafter.block_size - 1)


def prefill_groups(slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int],
                   finals: Sequence[bool], max_tokens: int) -> list[list[int]]:
    """Indices of the rows that can share prefill passes, at most max_tokens // length rows (at least 1) each.

    Rows of one group have the same start, chunk length and finality, so nothing is padded and every row's
    pass has the shapes it would have alone. Fresh prompts (start 0) attend only to themselves and may sit
    in any slots (`ModelRunner._prefill_rows` runs them in a scratch cache); a continued prompt reads its
    slot's cache, so its group is a run of consecutive slots (a pass works on a slice of the cache).
    """
    groups: list[list[int]] = []
    open_group: dict[tuple, list[int]] = {}  # (start, length, final) -> the group rows of that shape join
    for i in sorted(range(len(slots)), key=lambda i: slots[i]):
        n, key = len(chunks[i]), (starts[i], len(chunks[i]), finals[i])
        g = open_group.get(key)
        if g is None or (len(g) + 1) * n > max_tokens or (starts[i] > 0 and slots[i] != slots[g[-1]] + 1):
            g = open_group[key] = []
            groups.append(g)
        g.append(i)
    return groups


class ModelRunner:
    def __init__(self, target: TargetForward, cfg: EngineConfig, drafter=None, head=None, timing: bool = False,
                 max_batch: Optional[int] = None, plan=None):
        self.target, self.cfg = target, cfg
        self.device = target.device
        self.max_batch = max_batch or cfg.max_batch_size
        self.max_len = cfg.max_seq_len
        # N nodes per verification: the anchor + the drafts verified (the drafter's block - 1, or the first
        # engine.draft_tokens of them), or a tree head's node count (DDTree)
        self.block = verified_nodes(cfg, drafter, head)
        # engine.draft_tokens=k: the drafter's block still runs whole (its slots attend to each other), but the LM
        # head and the spec head see only the first k slots; drafts past k would never be verified
        self.draft_slots = cfg.draft_tokens or None
        slack = self.block + 1  # a block may write past max_len before its length is checked
        from .kv_cache import check_cache_fits
        from .systems import DecoderParts

        need = DecoderParts(target, drafter, head, self.block).cache_bytes_per_slot(self.max_len) * self.max_batch
        check_cache_fits(need, self.device, f"the KV caches of {self.max_batch} slot(s) x engine.max_seq_len="
                                            f"{self.max_len} positions (target{' + drafter' if drafter else ''})")
        self.cache = target.new_cache(self.max_batch, self.max_len, slack=slack)
        self.drafting = (DraftRunner(drafter, head, target, self.max_batch, self.max_len, slack, plan)
                         if drafter is not None else None)
        self.last_token = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)  # (C_max,) anchors
        self.temps = torch.zeros(self.max_batch, dtype=torch.float32, device=self.device)
        self.alive = torch.zeros(self.max_batch, dtype=torch.bool, device=self.device)  # prompt in, decoding
        # cap - lens = drafts a row may still offer: min(prompt + max_new - 2, max_len - 1) (a block commits
        # accepted + 1 tokens; the first output token is the anchor, not yet in the cache)
        self.cap = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)
        self.sampling: list[Optional[SlotSampling]] = [None] * self.max_batch
        self.timers = StageTimers(timing, self.device)
        self.head_generator = torch.Generator(self.device).manual_seed(cfg.seed)
        self.graphs = None
        if self.device.type == "cuda" and cfg.cuda_graphs and (plan is None or plan.cuda_graphs != "off"):
            from .cuda_graphs import GraphedSteps
            self.graphs = GraphedSteps(self)

    # ------------------------------------------------------------------ slots

    def open_slot(self, slot: int, sampling: SlotSampling, prompt_len: int, max_new: int) -> None:
        """A new sequence in `slot` (scalar writes: no host sync)."""
        self.sampling[slot] = sampling
        self.temps[slot] = sampling.temperature
        self.cap[slot] = min(prompt_len + max_new - 2, self.max_len - 1)
        self.alive[slot] = False
        self._empty(slot)

    def close_slot(self, slot: int) -> None:
        self.sampling[slot] = None
        self.alive[slot] = False
        self._empty(slot)

    def _empty(self, slot: int) -> None:
        self.cache.lens[slot] = 0
        if self.drafting is not None:
            self.drafting.reset(slot)

    def _index(self, ids: Sequence[int]) -> torch.Tensor:
        """Host ints -> a device index tensor without a blocking copy (pinned + non_blocking on CUDA)."""
        t = torch.tensor(list(ids), dtype=torch.long)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def probs(self, logits: torch.Tensor, slots: Sequence[int], temps: torch.Tensor) -> torch.Tensor:
        """(C, N, V) target distributions of rows `slots` (temperatures temps (C,)), each row with its own
        top_k / top_p."""
        samp = [self.sampling[s] for s in slots]
        keys = [(s.top_k, s.top_p) if s is not None else (self.cfg.top_k, self.cfg.top_p) for s in samp]
        groups = sorted(set(keys))
        if len(groups) == 1:
            return target_probs(logits, temps, *groups[0])
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        for key in groups:
            idx = self._index([i for i, k in enumerate(keys) if k == key])
            out[idx] = target_probs(logits[idx], temps[idx], *key)
        return out

    def all_greedy(self, slots: Sequence[int]) -> bool:
        """Whether every row of `slots` decodes greedily (known on the host: no device sync)."""
        return all(self.sampling[s] is None or self.sampling[s].temperature <= 0 for s in slots)

    def _uniforms(self, slots: Sequence[int], shape: tuple[int, ...]) -> torch.Tensor:
        gens = [s.generator if s is not None else None for s in (self.sampling[i] for i in slots)]
        return draw_uniforms(gens, shape, self.device)

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int],
                finals: Sequence[bool]) -> list[Optional[int]]:
        """Prompt chunk i (its tokens at positions starts[i]...) into slot slots[i]; the slot's cache
        length becomes starts[i] + len(chunks[i]). Returns, for rows whose chunk ends the prompt
        (finals[i]), the first generated token (sampled with the slot's settings), else None.

        Rows of the same shape (equal start, chunk length and finality: `prefill_groups`) share passes of (C, t)
        tokens, C * t <= PREFILL_TOKENS, which bounds attention memory: thousands of equal prompts (a sampling
        study, a benchmark's batch) cost a few passes instead of a pass, with its Python and small ops, per row
        (docs/results.md, "CPU fast paths"). Nothing is padded, so a row's pass has the shapes it would have
        alone and its numbers never depend on prompts of other shapes; beside equal-shaped rows a GEMM of more
        rows may round differently in the last ulp, as a decode block's rows already do. A row goes straight
        into its own cache slot, or, for fresh prompts in scattered slots, through a cache of just the group's
        prompts (their K/V only, copied in after).
        """
        firsts: list[Optional[int]] = [None] * len(slots)
        for group in prefill_groups(slots, chunks, starts, finals, PREFILL_TOKENS):
            first = self._prefill_rows([slots[i] for i in group], [chunks[i] for i in group], starts[group[0]],
                                       finals[group[0]])
            for i, tok in zip(group, first or []):
                firsts[i] = tok
        return firsts

    def _prefill_rows(self, slots: list[int], chunks: Sequence[Sequence[int]], start: int,
                      final: bool) -> Optional[list[int]]:
        """Chunks of one length into `slots` (C,) from position `start`, in pieces of at most
        PREFILL_TOKENS // C tokens; the first tokens (C,) when `final`, else None."""
        c, n = len(slots), len(chunks[0])
        # one host->device copy: the tokens (C, n), then the slots (C,)
        packed = self._index([tok for chunk in chunks for tok in chunk] + slots)
        tokens, idx = packed[:c * n].view(c, n), packed[c * n:]
        if slots == list(range(slots[0], slots[0] + c)):
            cache, rows = self.cache, slice(slots[0], slots[0] + c)  # straight into the slots
        else:  # fresh prompts (prefill_groups): a cache of just these rows, copied into the slots after
            cache, rows = self.target.new_cache(c, n, slack=0), slice(0, c)
        out = self._prefill_passes(tokens, idx, cache, rows, start, final)
        if cache is not self.cache:
            self.cache.copy_rows_in(idx, cache, n)
        self.cache.lens[idx] = start + n
        if not final:
            return None
        u = self._uniforms(slots, (1, 2))  # (C, 1, 2): the same draw count as one block node
        if self.all_greedy(slots):
            first = out.logits[:, 0].argmax(-1)  # what sampling one-hot p gives, without it
        else:
            p = self.probs(out.logits, slots, self.temps[idx])[:, 0]  # (C, V)
            first = sample_with_uniform(p, u[:, 0, 1])
        self.last_token[idx] = first
        self.alive[idx] = True
        return first.tolist()

    def _prefill_passes(self, tokens: torch.Tensor, idx: torch.Tensor, cache, rows: slice, start: int,
                        final: bool) -> Optional[ForwardOut]:
        """Target passes over tokens (C, n) in pieces of at most PREFILL_TOKENS // C tokens into `rows` of
        `cache`, the drafter's context into slots idx (C,); the last piece's output (logits when final)."""
        c, n = tokens.shape
        t = max(1, min(n, PREFILL_TOKENS // c))  # tokens per piece
        out = None
        for a in range(0, n, t):
            piece, pos = tokens[:, a:a + t], start + a  # (C, t')
            at, last = idx.new_full((c,), pos), idx.new_full((c,), piece.shape[1] - 1)  # (C,) each
            cache.lens[rows] = pos
            want_logits = final and a + piece.shape[1] == n  # only the prompt's last position samples
            out = self.target(piece, cache, rows, kv_len=pos + piece.shape[1], want_logits=want_logits,
                              logits_at=last[:, None] if want_logits else None,
                              want_captured=self.drafting is not None)
            if self.drafting is not None:
                self.drafting.prefill_context(idx, at, out.captured, last)
        return out

    # ------------------------------------------------------------------ one block

    def target_pass(self, tokens: torch.Tensor, rows: slice, kv_len: int,
                    parents: Optional[torch.Tensor] = None) -> ForwardOut:
        """The target over candidate nodes (C, N) of `rows` (parents: a tree's structure, None = chain)."""
        return self.target(tokens, self.cache, rows, kv_len,
                           node_depth=depths(parents) if parents is not None else None,
                           tree_mask=ancestor_mask(parents) if parents is not None else None,
                           want_captured=self.drafting is not None)

    def draft_backbone(self, rows: slice, anchor: torch.Tensor, lens: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The drafter's final-normed hidden states of its mask slots (C, S, H) over its context: S = B - 1, or
        engine.draft_tokens."""
        d = self.drafting
        dev = anchor.device
        embeds = d.drafter.embed_blocks(anchor, self.target.embed).to(d.target_state.dtype)  # (C, B, H)
        positions = lens[:, None] + torch.arange(d.block_size, device=dev)[None, :]  # anchor sits at index lens
        ctx_kv = [d.ctx_cache.read(layer, rows, kv_len) for layer in range(len(d.ctx_cache.k))]
        ctx_valid = torch.arange(kv_len, device=dev)[None, :] < lens[:, None]  # (C, Tc)
        slots = d.drafter.forward_block(embeds, positions, ctx_kv, ctx_valid, d.drafter_fast)[:, 1:]  # (C, B-1, H)
        return slots if self.draft_slots is None else slots[:, :self.draft_slots]

    def draft_logits(self, slot_hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head on the drafter's slots (C, S, V): the drafter has no norm of the target's.
        With a draft vocabulary only its rows are computed; the rest are floored (never proposed), or, for a
        head that takes vocab_ids (DraftRunner.vocab_ids), left out: (C, S, V') over the draft vocabulary."""
        d, h = self.drafting, slot_hidden.to(self.target.dtype)
        if d.vocab_ids is not None:
            return d.drafter.draft_vocab_logits(h, self.target.lm_head_weight, self.target.lm_head_proj)
        return d.drafter.logits(h, self.target.lm_head_weight, self.target.lm_head_proj)

    @torch.no_grad()
    def draft(self, rows: slice, anchor: torch.Tensor, lens: torch.Tensor, ctx_len: int, graphs=None):
        """A Proposal (tokens (C, S), num_proposed (C,), q_probs or None) for the rows of `rows`."""
        t = self.timers
        if graphs is not None:
            with t.stage("draft_backbone"):  # backbone + LM head in one replay; timed as one stage
                slot_hidden, slot_logits = graphs.draft_backbone(anchor)
        else:
            with t.stage("draft_backbone"):
                slot_hidden = self.draft_backbone(rows, anchor, lens, ctx_len)
            with t.stage("lm_head"):
                slot_logits = self.draft_logits(slot_hidden)
        with t.stage("spec_head"):
            temps = [s.temperature if s is not None else 0.0 for s in self.sampling[rows]]
            proposal = self.drafting.propose(rows, slot_logits, slot_hidden, anchor, temps, self.head_generator)
            if self.cfg.adaptive_draft_survival > 0:  # engine/adaptive_draft.py: this block's length per row
                proposal.num_proposed = adaptive_draft.cut(proposal.num_proposed, slot_logits, temps,
                                                           self.cfg.adaptive_draft_survival)
            return proposal

    @torch.no_grad()
    def verify(self, rows: slice, cands: Candidates, q: Optional[torch.Tensor], kv_len: int,
               graphs=None) -> tuple[ForwardOut, Verdict]:
        """One target pass over the candidates, then the lossless acceptance walk with each row's settings."""
        tree = not cands.is_chain
        with self.timers.stage("target_verify"):
            if graphs is not None and not tree:
                out = graphs.verify(cands.tokens)
            else:
                out = self.target_pass(cands.tokens, rows, kv_len, cands.parents if tree else None)
        with self.timers.stage("accept_residual"):
            slots = range(rows.start, rows.stop)
            # drawn either way, as many as a full pass's whatever this one's width: each row's stream stays aligned
            u = self._uniforms(slots, (max(self.block, cands.size), 2))[:, :cands.size]
            if self.all_greedy(slots):
                verdict = verify_greedy(out.logits, cands)  # no (C, N, V) softmax, one-hot or sampling noise
            else:
                p = self.probs(out.logits, slots, self.temps[rows])  # (C, N, V)
                verdict = verify_candidates(p, cands, u, q)
        return out, verdict

    @torch.no_grad()
    def commit(self, rows: slice, lens: torch.Tensor, anchor: torch.Tensor, cands: Candidates, out: ForwardOut,
               verdict: Verdict, alive: torch.Tensor) -> torch.Tensor:
        """Advance each live row by its accepted path + next token (cache, drafter context, anchor).
        Rows with alive False keep their state. Returns accepted (C,). Lengths move last, so a failure
        before that leaves every row's visible state as it was."""
        tree = not cands.is_chain
        accepted = verdict.num_accepted * alive  # (C,)
        with self.timers.stage("accept_residual"):
            if tree:
                self.cache.compact(rows, lens, verdict.path)
        if self.drafting is not None:
            with self.timers.stage("draft_backbone"):  # extending the drafter's context is drafter work
                captured = out.captured
                if tree:
                    captured = captured.gather(1, verdict.path[:, :, None].expand(-1, -1, captured.shape[-1]))
                self.drafting.commit_context(rows, lens, captured, accepted, alive)
        self.cache.lens[rows] = lens + (1 + accepted) * alive
        self.last_token[rows] = torch.where(alive, verdict.next_token, anchor)
        return accepted

    @torch.no_grad()
    def run_block(self, rows: slice, longest: int, eager: bool = False) -> BlockOut:
        """One block for the rows of `rows` (those with `alive` set decode; the others keep their state).
        longest: the largest committed length among live rows (host-known: it bounds attention on the
        eager path). eager=True skips the CUDA graphs (a single row retried alone). The only read of the
        device is the block's packed result at the end."""
        graphs = None if eager else self.graphs
        if graphs is not None:
            assert rows == graphs.rows, "graphed blocks run every slot"
        n = rows.stop - rows.start
        dev = self.device
        live = self.alive[rows]  # (C,)
        lens = self.cache.lens[rows].clone()  # (C,) before this block
        anchor = self.last_token[rows].clone()  # (C,)
        kv_len = self.cache.capacity if graphs is not None else longest + self.block
        q = None
        if self.drafting is None:
            cands = Candidates(tokens=anchor[:, None], parents=torch.full((n, 1), -1, device=dev),
                               num_nodes=torch.ones(n, dtype=torch.long, device=dev))
        else:
            ctx_len = self.cache.capacity if graphs is not None else longest
            proposal = self.draft(rows, anchor, lens, ctx_len, graphs)
            # Never propose past a row's token budget or its cache: a block commits accepted + 1.
            allowed = torch.where(live, (self.cap[rows] - lens).clamp(0, self.block - 1), 0)  # (C,)
            num_proposed = torch.minimum(proposal.num_proposed.to(torch.long), allowed)
            if "candidates" in proposal.extra:  # a tree head (DDTree) builds its own candidates
                cands = proposal.extra["candidates"](anchor, allowed)
            else:  # the first block - 1 drafts (all, unless engine.draft_tokens cuts them), or the longest row's
                width = (adaptive_draft.verified_width(num_proposed) if self.cfg.adaptive_draft_survival > 0
                         and graphs is None else self.block - 1)
                cands = chain(anchor, proposal.tokens[:, :width].to(torch.long), num_proposed)
            if proposal.q_probs is not None:
                qp = proposal.q_probs[:, :cands.size - 1].float()
                q = torch.cat([torch.zeros_like(qp[:, :1]), qp], dim=1)  # (C, N, V) node-indexed
        out, verdict = self.verify(rows, cands, q, kv_len, graphs)
        accepted = self.commit(rows, lens, anchor, cands, out, verdict, live)
        path_tokens = cands.tokens.gather(1, verdict.path)  # (C, N) tokens along the accepted path
        offered = cands.num_nodes - 1 if cands.is_chain else tree_depth(cands)  # draft slots offered
        packed = torch.cat([accepted[:, None], offered[:, None].to(torch.long), verdict.next_token[:, None],
                            path_tokens], dim=1)  # (C, 3 + N): one device-to-host copy
        if packed.device.type == "cuda":
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            torch.cuda.current_stream(packed.device).synchronize()
            packed = host
        rows_out = packed.tolist()
        return BlockOut(accepted=[r[0] for r in rows_out], proposed=[r[1] for r in rows_out],
                        tokens=[r[4:4 + r[0]] + [r[2]] for r in rows_out])
