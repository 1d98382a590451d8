"""The drafting half of a speculative step: DFlash backbone over its context cache, LM head, spec head.

The drafter's context is the fused target hidden states of every token the target has processed.
Its per-layer K/V live in a static cache shaped like the target's, with its own per-row lengths that
always equal the target cache's: the DraftRunner is the only writer of that cache (prefill pieces and
block commits), and every write asserts the two lengths agree before it extends them, as gpt-fast's
KVCache.update asserts its write fits. The check is `torch._assert_async`: no host sync on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lilicorr.models import drafter_fast

from .kv_cache import KVCache
from .target_forward import TargetForward


def head_options(head, plan) -> dict:
    """The keyword arguments the engine passes to `head.propose`: a LiLiCorr head gets its HeadInference, with the
    path the plan names (heads/lilicorr_inference.py); other heads none."""
    from lilicorr.models.heads.lilicorr import LiLiCorrHead
    from lilicorr.models.heads.lilicorr_inference import HeadInference

    if not isinstance(head, LiLiCorrHead):
        return {}
    return {"fast": HeadInference(native=plan is not None and plan.head_native)}


@dataclass(frozen=True)
class ObservedProposal:
    """One DraftRunner.propose call as its observers see it: the arguments (`args`, to call propose again) and the
    Proposal it returned. The head states it read are the runner's target_state[rows] / context_state[rows], which
    the call leaves unchanged. The tensors are the engine's own: an observer that keeps one clones it."""

    rows: slice
    slot_logits: torch.Tensor  # (C, S, V) as the head received them (full or draft-vocabulary width)
    slot_hidden: torch.Tensor  # (C, S, H_d)
    anchor: torch.Tensor  # (C,)
    temps: list
    generator: Optional[torch.Generator]
    proposal: object  # models.heads.base.Proposal

    @property
    def args(self) -> tuple:
        return self.rows, self.slot_logits, self.slot_hidden, self.anchor, self.temps, self.generator


class DraftRunner:
    """drafter: DFlashDrafter inference form; head: SpecHead (its system choices, e.g. a sampled proposal,
    settled when the system was built: engine/systems.py); target: TargetForward (embedding, LM head)."""

    def __init__(self, drafter, head, target: TargetForward, max_batch: int, max_len: int, slack: int, plan=None):
        self.drafter, self.head, self.target = drafter, head, target
        # plan: the decoder's backend.BackendPlan (None: the scripted forms where they apply, no C head)
        # what the head's proposals take, with the tables they derive (a LiLiCorr head's HeadInference): this
        # decoder's, passed to every propose, never kept on the head
        self.head_options = head_options(head, plan)
        self.block_size = drafter.block_size
        self.mask_token_id = drafter.mask_token_id
        self.sampled = bool(getattr(head, "sampled", False))
        s = drafter.shape
        dtype = next(drafter.parameters()).dtype  # the target's, or bf16 (engine.cpu_drafter_bf16)
        # the drafter's scripted form where the plan chose it and its layers are plain ones (its projections on
        # oneDNN too where the target's are: engine.cpu_prepack), else its modules (None)
        self.drafter_fast = (drafter_fast.DrafterInference(drafter, target.prepack)
                             if (plan is None or plan.drafter_scripted) and drafter_fast.plain_layers(drafter) else None)
        self.head_dtype = target.dtype  # heads run in the target's dtype (systems.load_draft_model)
        device = next(drafter.parameters()).device
        self.ctx_cache = KVCache(s.num_layers, max_batch, s.num_kv_heads, max_len, s.head_dim, dtype, device, slack)
        width = s.num_captured * target.hidden_size
        self.target_state = torch.zeros(max_batch, width, dtype=dtype, device=device)  # (C_max, n*H)
        # The drafter's fused context at the same position, for a head that reads it (it would redo fc per block)
        self.context_state = (torch.zeros(max_batch, s.hidden_size, dtype=dtype, device=device)
                              if getattr(head, "reads_context_state", False) else None)  # (C_max, H_d)
        # Logits over the draft vocabulary only, for a head that takes vocab_ids: no full-width floor to fill
        # and scan. A sampled proposal's q must cover the target's vocabulary, so it keeps full logits.
        self.vocab_ids = (drafter.draft_ids.to(device) if drafter.draft_ids is not None
                          and getattr(head, "compact_vocab", False) and not self.sampled else None)  # (V',)
        # Called with an ObservedProposal after every proposal, in order (benchmarks record the head's inputs and
        # outputs here instead of replacing `propose`); empty, the loop in `propose` is the whole cost.
        self.observers: list[Callable[[ObservedProposal], None]] = []

    def reset(self, slot: int) -> None:
        """A slot opens or closes: its context is empty (like the target cache's length)."""
        self.ctx_cache.lens[slot] = 0

    def _project(self, captured: torch.Tensor, start: torch.Tensor):
        """captured (C, T, n*H) at positions start + j -> (positions (C, T), fused context (C, T, H_d),
        per-layer (k, v) (C, n_kv, T, hd))."""
        t = captured.shape[1]
        pos = start[:, None] + torch.arange(t, device=captured.device)[None, :]  # (C, T)
        ctx, kvs = self.drafter.context(captured.to(self.target_state.dtype), pos, self.drafter_fast)  # fuse, project
        return pos, ctx, kvs

    def _check_lengths(self, rows, start: torch.Tensor) -> None:
        torch._assert_async((self.ctx_cache.lens[rows] == start).all(),
                            "drafter context and target cache lengths differ")

    def _keep_state(self, rows, captured: torch.Tensor, ctx: torch.Tensor, last: torch.Tensor) -> None:
        idx = torch.arange(captured.shape[0], device=captured.device)
        self.target_state[rows] = captured[idx, last].to(self.target_state.dtype)
        if self.context_state is not None:
            self.context_state[rows] = ctx[idx, last]

    @torch.no_grad()
    def prefill_context(self, slots: torch.Tensor, start: torch.Tensor, captured: torch.Tensor,
                        last: torch.Tensor) -> None:
        """A prompt piece's context: captured (C, T, n*H) at positions start + j of (scattered) slots (C,).
        last (C,): index in T of each row's newest state, kept as the heads' `target_state`."""
        self._check_lengths(slots, start)
        pos, ctx, kvs = self._project(captured, start)
        for layer, (k, v) in enumerate(kvs):  # (C, n_kv, T, hd) -> cache[slot, :, pos]
            self.ctx_cache.k[layer][slots[:, None], :, pos] = k.transpose(1, 2)
            self.ctx_cache.v[layer][slots[:, None], :, pos] = v.transpose(1, 2)
        self.ctx_cache.lens[slots] = start + captured.shape[1]
        self._keep_state(slots, captured, ctx, last)

    @torch.no_grad()
    def commit_context(self, rows: slice, start: torch.Tensor, captured: torch.Tensor, accepted: torch.Tensor,
                       alive: torch.Tensor) -> None:
        """A verified block's context: the target states of captured (C, T, n*H) at positions start + j.

        Writes all T (static shape); only the committed ones become visible, because visibility is
        `position < lens`: a live row's length grows by 1 + accepted (C,), as the target cache's does. The
        newest committed state (index accepted) becomes the heads' `target_state`.
        """
        self._check_lengths(rows, start)
        pos, ctx, kvs = self._project(captured, start)
        for layer, (k, v) in enumerate(kvs):
            self.ctx_cache.write(layer, rows, pos, k, v)
        self.ctx_cache.lens[rows] = start + (1 + accepted) * alive
        self._keep_state(rows, captured, ctx, accepted)

    @torch.no_grad()
    def propose(self, rows, slot_logits: torch.Tensor, slot_hidden: torch.Tensor, anchor: torch.Tensor,
                temps: list[float], generator: torch.Generator):
        """The head's Proposal for rows `rows` (temps: each row's temperature), shown to every observer."""
        proposal = self._propose(rows, slot_logits, slot_hidden, anchor, temps, generator)
        for observe in self.observers:
            observe(ObservedProposal(rows, slot_logits, slot_hidden, anchor, temps, generator, proposal))
        return proposal

    def _propose(self, rows, slot_logits: torch.Tensor, slot_hidden: torch.Tensor, anchor: torch.Tensor,
                 temps: list[float], generator: torch.Generator):
        """A sampled head draws each row at that row's own temperature: rows are grouped by temperature; greedy rows
        of a mixed batch get q = one-hot of their (argmax) tokens, which makes the sampled-proposal verification rule
        the deterministic one."""
        from lilicorr.models.heads.base import Proposal

        # a bf16 drafter's (engine.cpu_drafter_bf16) states for a head in the target's dtype
        state, slot_hidden = self.target_state[rows].to(self.head_dtype), slot_hidden.to(self.head_dtype)
        if not self.sampled:
            extra = dict(self.head_options)
            if self.vocab_ids is not None:
                extra["vocab_ids"] = self.vocab_ids
            if self.context_state is not None:
                extra["context_state"] = self.context_state[rows]
            return self.head.propose(slot_logits, slot_hidden, state, anchor, generator=generator, **extra)
        groups = sorted(set(temps))
        if len(groups) == 1:
            return self.head.propose(slot_logits, slot_hidden, state, anchor, temperature=groups[0],
                                     generator=generator)
        c, s_, v = slot_logits.shape
        tokens = torch.zeros(c, s_, dtype=torch.long, device=anchor.device)
        num = torch.zeros(c, dtype=torch.long, device=anchor.device)
        q = torch.zeros(c, s_, v, dtype=torch.float32, device=anchor.device)
        for temp in groups:
            idx = torch.tensor([i for i, x in enumerate(temps) if x == temp], device=anchor.device)
            p = self.head.propose(slot_logits[idx], slot_hidden[idx], state[idx], anchor[idx], temperature=temp,
                                  generator=generator)
            tokens[idx], num[idx] = p.tokens.long(), p.num_proposed.long()
            q[idx] = (p.q_probs.float() if p.q_probs is not None
                      else torch.nn.functional.one_hot(p.tokens.long(), v).float())
        return Proposal(tokens=tokens, num_proposed=num, q_probs=q)
