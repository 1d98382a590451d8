"""The drafting half of a speculative step: DFlash backbone over its context cache, LM head, spec head.

The drafter's context is the fused target hidden states of every token the target has processed.
Its per-layer K/V live in a static cache shaped like the target's and share the target's per-row
lengths (context length == target cache length, always), so verification's commit extends both.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .target_forward import TargetForward


class DraftRunner:
    """drafter: DFlashDrafter inference form; head: SpecHead; target: TargetForward (embedding, LM head)."""

    def __init__(self, drafter, head, target: TargetForward, max_batch: int, max_len: int, slack: int):
        self.drafter, self.head, self.target = drafter, head, target
        self.block_size = drafter.block_size
        self.mask_token_id = drafter.mask_token_id
        self.sampled = bool(getattr(head, "sampled", False))
        s = drafter.shape
        dtype = next(drafter.parameters()).dtype
        device = next(drafter.parameters()).device
        self.ctx_cache = KVCache(s.num_layers, max_batch, s.num_kv_heads, max_len, s.head_dim, dtype, device, slack)
        width = s.num_captured * target.hidden_size
        self.target_state = torch.zeros(max_batch, width, dtype=dtype, device=device)  # (C_max, n*H)

    def _project(self, captured: torch.Tensor, start: torch.Tensor):
        """captured (C, T, n*H) at positions start + j -> (positions (C, T), per-layer (k, v) (C, n_kv, T, hd))."""
        t = captured.shape[1]
        pos = start[:, None] + torch.arange(t, device=captured.device)[None, :]  # (C, T)
        ctx = self.drafter.fuse_context(captured.to(self.target_state.dtype))  # (C, T, H)
        return pos, self.drafter.project_context(ctx, pos)

    def _keep_state(self, rows, captured: torch.Tensor, last: torch.Tensor) -> None:
        idx = torch.arange(captured.shape[0], device=captured.device)
        self.target_state[rows] = captured[idx, last].to(self.target_state.dtype)

    @torch.no_grad()
    def commit_context(self, rows: slice, start: torch.Tensor, captured: torch.Tensor,
                       last: torch.Tensor) -> None:
        """Append the target states of captured (C, T, n*H) at positions start + j (start (C,)).

        Writes all T (static shape); only the first `accepted` become visible, because visibility is
        `position < lens` and the caller advances lens by what it accepted. last (C,): index in T of
        each row's newest committed state, kept as the heads' `target_state`.
        """
        pos, kvs = self._project(captured, start)
        for layer, (k, v) in enumerate(kvs):
            self.ctx_cache.write(layer, rows, pos, k, v)
        self._keep_state(rows, captured, last)

    @torch.no_grad()
    def prefill_context(self, slots: torch.Tensor, captured: torch.Tensor, last: torch.Tensor) -> None:
        """Context of new sequences in (possibly scattered) slots (C,): captured (C, T, n*H) at 0..T-1."""
        t = captured.shape[1]
        _, kvs = self._project(captured, torch.zeros(captured.shape[0], dtype=torch.long, device=captured.device))
        for layer, (k, v) in enumerate(kvs):
            self.ctx_cache.k[layer][slots, :, :t] = k
            self.ctx_cache.v[layer][slots, :, :t] = v
        self._keep_state(slots, captured, last)
