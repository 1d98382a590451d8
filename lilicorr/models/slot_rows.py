"""Per-(block, slot) loss terms without (blocks, slots, vocabulary) tensors: the LM head, log-softmax, top-K and
CE of every head, computed in checkpointed chunks of rows (docs/design.md §9).

At Table 4 sizes one sequence has R = 512 anchors x 15 slots = 7,680 rows over V = 151,936 tokens: every
(R, V) tensor is 2.3 GB in bf16 and 4.7 GB in fp32, and a head's loss builds several (logits, log-softmax,
softmax, their gradients). Here the logits of a chunk of `chunk_rows` rows exist only inside one checkpointed
call: forward keeps the chunk's small per-row outputs (CE terms, top-K log-probs, L1 distances), backward
recomputes the chunk. Memory is O(chunk_rows x V) at any anchor density.

A head says what it needs per row by two methods (heads/base.py):
    row_inputs(batch) -> {name: (C, S, ...)}   per-row tensors of its own, with grad (Domino's MLP hidden)
    row_terms(rows)   -> {name: (r, ...)}      per-row outputs from one chunk of `SlotRows`
and `slot_terms(batch, head)` runs them: once over the batch's dense logits when it carries them (tests, the
reference form), else chunk by chunk from the drafter's hidden states through the frozen LM head. Both forms
run the same head code, so they agree to rounding (tests/models/test_models_chunked_losses.py).

The target's side (no grad): its greedy token and log-normaliser are computed once per row position
(`position_stats`, chunked over positions), and a candidate's log q is then one dot product minus that
normaliser; the full (r, V) target logits are built inside a chunk only for heads that read the whole
distribution (soft labels, DSpark's L1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


class SlotLM:
    """The frozen LM head over the columns a training batch scores.

    compact (a draft vocabulary and a head that trains on it): the columns are the draft vocabulary's ids, for
    the drafter and the target alike (the target's softmax over them is its distribution renormalised there).
    Otherwise the columns are the whole vocabulary; the drafter's logits outside a draft vocabulary are floored
    (`DFlashDrafter.logits`) and its soft labels are the target's logits floored there (`restrict`).
    """

    def __init__(self, drafter, lm_weight: Tensor, compact: bool):
        self.drafter = drafter
        self.weight = lm_weight  # (V, H) the target's, frozen
        self.compact = bool(compact and drafter.draft_ids is not None)
        self.vocab_ids = drafter.draft_ids if self.compact else None  # (V',) or None

    @property
    def column_weight(self) -> Tensor:
        """(cols, H): the LM head rows of the batch's columns."""
        return self.drafter.draft_lm_weight(self.weight) if self.compact else self.weight

    def drafter_logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., H) with grad -> (..., cols) in the LM head's dtype."""
        h = hidden.to(self.weight.dtype)
        return F.linear(h, self.column_weight) if self.compact else self.drafter.logits(h, self.weight)

    def target_logits(self, hidden: Tensor) -> Tensor:
        """The target's final-normed states (..., H) -> its logits over the columns (..., cols), no grad."""
        with torch.no_grad():
            return F.linear(hidden.to(self.weight.dtype), self.column_weight)

    def soft_label_logits(self, target_logits: Tensor) -> Tensor:
        """The target's logits over the columns -> the soft labels' logits (renormalised over what is drafted)."""
        return target_logits if self.compact else self.drafter.restrict(target_logits)

    def label_columns(self, labels: Tensor) -> Tensor:
        """Token ids -> column indices (labels outside a draft vocabulary land on a neighbour; masked by callers)."""
        labels = labels.clamp_min(0)
        return self.drafter.draft_index(labels) if self.compact else labels


@torch.no_grad()
def position_stats(final_hidden: Tensor, lm: SlotLM, chunk_rows: int) -> tuple[Tensor, Tensor]:
    """final_hidden (N, T, H) -> the target's greedy token over the full vocabulary (N, T) int64 and its
    log-normaliser over the batch's columns (N, T) fp32, in chunks of positions (never (N, T, V) at once)."""
    N, T, H = final_hidden.shape
    flat = final_hidden.reshape(N * T, H).to(lm.weight.dtype)
    greedy = torch.empty(N * T, dtype=torch.long, device=flat.device)
    lse = torch.empty(N * T, dtype=torch.float32, device=flat.device)
    for i in range(0, N * T, chunk_rows):
        logits = F.linear(flat[i:i + chunk_rows], lm.weight).float()  # (r, V)
        greedy[i:i + chunk_rows] = logits.argmax(-1)
        cols = logits if not lm.compact else logits.index_select(-1, lm.vocab_ids.to(logits.device))
        lse[i:i + chunk_rows] = torch.logsumexp(cols, dim=-1)
        del logits, cols
    return greedy.view(N, T), lse.view(N, T)


@dataclass
class SlotRows:
    """One chunk of r (block, slot) rows as a head's `row_terms` sees it."""

    logits: Tensor  # (r, cols) the drafter's logits, with grad
    label_cols: Tensor  # (r,) the label's column
    extra: dict  # the head's row_inputs, chunked: name -> (r, ...)
    distill: float  # weight of the soft-label CE
    _target_logits: Callable[[], Tensor]  # () -> (r, cols) the target's logits over the columns, no grad
    _target_logq: Callable[[Tensor], Tensor]  # cols (r, K) -> the target's log q there (r, K), no grad
    _soft: Callable[[Tensor], Tensor]  # target logits -> soft-label logits
    _cache: dict = field(default_factory=dict)

    def target_logits(self) -> Tensor:
        if "target" not in self._cache:
            self._cache["target"] = self._target_logits()
        return self._cache["target"]

    def target_logq(self, cols: Tensor) -> Tensor:
        return self._target_logq(cols)

    def logp(self) -> Tensor:
        """(r, cols) fp32 log-softmax of the drafter's logits (computed once per chunk)."""
        if "logp" not in self._cache:
            self._cache["logp"] = torch.log_softmax(self.logits.float(), dim=-1)
        return self._cache["logp"]

    def label_ce(self) -> dict[str, Tensor]:
        """Eq. 6's per-row CE terms: "hard" on the label; "soft" on the target's distribution when distill > 0."""
        logp = self.logp()
        out = {"hard": -logp.gather(-1, self.label_cols[:, None])[:, 0]}
        if self.distill > 0:
            soft = torch.softmax(self._soft(self.target_logits()).float(), dim=-1)
            out["soft"] = -(soft * logp).sum(-1)
        return out


def _chunk_rows_of(x: Tensor) -> Tensor:
    return x.reshape(-1, *x.shape[2:])  # (C, S, ...) -> (C*S, ...)


def slot_terms(batch, head) -> dict[str, Tensor]:
    """Run `head.row_terms` over every (block, slot) row of `batch` -> {name: (C, S, ...)}.

    Dense form when the batch carries slot_logits (and target_logits): one call over all rows. Chunked form
    otherwise: per chunk of `batch.chunk_rows` rows the drafter's logits come from slot_hidden through
    `batch.lm`, under activation checkpointing (recomputed in backward).
    """
    from torch.utils.checkpoint import checkpoint

    C, S = batch.labels.shape
    extra = {k: _chunk_rows_of(v) for k, v in head.row_inputs(batch).items()}
    distill = float(batch.distill)
    if batch.slot_logits is not None:  # dense (reference) form
        cols = batch.slot_logits.shape[-1]
        logits = batch.slot_logits.reshape(C * S, cols)
        tl = batch.target_logits.reshape(C * S, cols) if batch.target_logits is not None else None

        def dense_logq(c: Tensor) -> Tensor:
            with torch.no_grad():
                return torch.log_softmax(tl.float(), dim=-1).gather(-1, c)

        label_cols = batch.label_columns()
        rows = SlotRows(logits, _chunk_rows_of(label_cols), extra, distill, lambda: tl, dense_logq,
                        batch.soft_label_logits)
        return {k: v.view(C, S, *v.shape[1:]) for k, v in head.row_terms(rows).items()}

    lm = batch.lm
    h = _chunk_rows_of(batch.slot_hidden)  # (R, H)
    th = _chunk_rows_of(batch.target_hidden)  # (R, H), no grad
    lse = _chunk_rows_of(batch.target_lse)  # (R,)
    y = _chunk_rows_of(lm.label_columns(batch.labels))  # (R,)
    names = sorted(extra)

    def chunk(hc: Tensor, yc: Tensor, thc: Tensor, lsec: Tensor, *ex: Tensor) -> dict[str, Tensor]:
        def logq(c: Tensor) -> Tensor:  # (r, K): h_t . W[c] - log Z, one dot product per candidate
            with torch.no_grad():
                w = lm.column_weight[c]  # (r, K, H)
                return torch.einsum("rh,rkh->rk", thc.to(w.dtype), w).float() - lsec[:, None]

        rows = SlotRows(lm.drafter_logits(hc), yc, dict(zip(names, ex)), distill,
                        lambda: lm.target_logits(thc), logq, lm.soft_label_logits)
        return head.row_terms(rows)

    R = C * S
    if R == 0:  # no blocks: correctly shaped (empty) terms, still in the graph
        out = chunk(h, y, th, lse, *(extra[n] for n in names))
        return {k: v.view(C, S, *v.shape[1:]) for k, v in out.items()}
    parts = [checkpoint(chunk, h[i:i + batch.chunk_rows], y[i:i + batch.chunk_rows], th[i:i + batch.chunk_rows],
                        lse[i:i + batch.chunk_rows], *(extra[n][i:i + batch.chunk_rows] for n in names),
                        use_reentrant=False)
             for i in range(0, R, batch.chunk_rows)]
    return {k: torch.cat([p[k] for p in parts]).view(C, S, *parts[0][k].shape[1:]) for k in parts[0]}
