"""DDTree: a training-free tree of candidates over a block drafter's per-slot marginals.

The DFlash drafter gives, in one pass, a distribution for every slot of the block. DDTree keeps the
top-k tokens of each slot and grows a tree under the anchor best-first: a node at depth d is one of
slot d's top-k tokens, a path scores the sum of its nodes' log-probabilities, and the `budget`
highest-scoring paths' nodes form the tree (it is prefix-closed: a node's score never exceeds its
parent's). The target verifies every node in one pass with a tree attention mask (candidates.py), the
verifier (verify.py) walks the tree losslessly at any temperature (children of a node carry distinct
tokens, tried in node order), and the runner compacts the cache to the accepted path.

Best-first without a heap, all on device: the frontier holds, per row, at most one entry per tree node
("the next child of node p not in the tree yet"). Popping the best entry adds its node, replaces the
entry by that node's next sibling (the same parent, the next rank), and adds the new node's first
child (rank 0 at the next depth). Because ranks are sorted by log-probability, these two are the only
successors that can be next, so `budget` pops of (C, budget + 1) tensors build every row's tree.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .candidates import Candidates


def best_first_tree(anchor: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor, max_depth: torch.Tensor,
                    budget: int) -> Candidates:
    """anchor (C,); logp, ids (C, S, K): each slot's top-k log-probs (descending) and tokens; max_depth (C,):
    the deepest slot a row may use (its token budget). -> Candidates with 1 + up to `budget` nodes per row.
    (A TorchScript form of the pops measured < 1% of a block faster and was deleted: docs/results.md.)"""
    tokens, parents, num = _grow_tree(anchor, logp.float(), ids, max_depth, budget)
    return Candidates(tokens=tokens, parents=parents, num_nodes=num, is_chain=False)


def _grow_tree(anchor: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor, max_depth: torch.Tensor,
               budget: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """best_first_tree's body over plain tensors (logp fp32) -> tokens, parents (C, 1 + budget), num_nodes (C,)."""
    c, s, k = logp.shape
    dev = logp.device
    n = budget + 1
    rows = torch.arange(c, device=dev)
    neg = torch.full((1,), float("-inf"), device=dev)
    tokens = torch.zeros(c, n, dtype=torch.long, device=dev)
    tokens[:, 0] = anchor
    parents = torch.zeros(c, n, dtype=torch.long, device=dev)  # unused nodes hang off the anchor (ignored)
    parents[:, 0] = -1
    # Frontier entry j: candidate node (parent f_parent, depth f_depth, rank f_rank) with path score f_score.
    f_score = torch.full((c, n), float("-inf"), device=dev)
    f_parent = torch.zeros(c, n, dtype=torch.long, device=dev)
    f_depth = torch.ones(c, n, dtype=torch.long, device=dev)
    f_rank = torch.zeros(c, n, dtype=torch.long, device=dev)
    f_score[:, 0] = torch.where(max_depth >= 1, logp[:, 0, 0], neg)
    num = torch.ones(c, dtype=torch.long, device=dev)
    for i in range(1, n):
        best = f_score.argmax(1)  # (C,) first best entry: ties go to the older entry
        sc = f_score[rows, best]
        ok = sc > float("-inf")  # rows whose tree is complete add nothing
        d, r, par = f_depth[rows, best], f_rank[rows, best], f_parent[rows, best]
        tokens[:, i] = torch.where(ok, ids[rows, d - 1, r], tokens[:, i])
        parents[:, i] = torch.where(ok, par, parents[:, i])
        num += ok.long()
        # the popped entry becomes the next sibling of the node it added
        r1 = (r + 1).clamp(max=k - 1)
        sibling = sc - logp[rows, d - 1, r] + logp[rows, d - 1, r1]
        f_score[rows, best] = torch.where(ok & (r + 1 < k), sibling, neg)
        f_rank[rows, best] = r1
        # the added node's first child enters at entry i
        dc = d.clamp(max=s - 1)
        f_score[:, i] = torch.where(ok & (d < max_depth) & (d < s), sc + logp[rows, dc, 0], neg)
        f_parent[:, i] = i
        f_depth[:, i] = d + 1
        f_rank[:, i] = 0
    return tokens, parents, num


def tree_depth(cands: Candidates) -> torch.Tensor:
    """(C,) the deepest valid node of each row (the draft slots a tree offers)."""
    from .candidates import depths

    n = cands.tokens.shape[1]
    valid = torch.arange(n, device=cands.tokens.device)[None, :] < cands.num_nodes[:, None]
    return (depths(cands.parents) * valid).max(1).values


class DDTreeHead(nn.Module):
    """Wraps a vanilla DFlash head: its proposal carries a tree builder the runner calls with each row's
    depth budget (`proposal.extra["candidates"](anchor, allowed) -> Candidates`)."""

    name = "ddtree"
    sampled = False

    def __init__(self, base: nn.Module, budget: int, top_k: int):
        super().__init__()
        if budget < 1 or top_k < 1:
            raise ValueError(f"DDTree needs a node budget and top_k >= 1 (got {budget}, {top_k})")
        self.base, self.budget, self.top_k = base, int(budget), int(top_k)
        self.num_nodes = self.budget + 1  # nodes per verification, anchor included
        self.compact_vocab = bool(getattr(base, "compact_vocab", False))  # logits over a draft vocabulary

    def propose(self, slot_logits, slot_hidden, target_state, anchor_ids, temperature=0.0,
                generator: Optional[torch.Generator] = None, vocab_ids: Optional[torch.Tensor] = None):
        """vocab_ids (V',): the token of each logit column when slot_logits cover a draft vocabulary only."""
        compact = {} if vocab_ids is None else {"vocab_ids": vocab_ids}
        proposal = self.base.propose(slot_logits, slot_hidden, target_state, anchor_ids, **compact)
        k = min(self.top_k, slot_logits.shape[-1])
        logp, ids = F.log_softmax(slot_logits.float(), dim=-1).topk(k, dim=-1)  # (C, S, K) descending
        if vocab_ids is not None:
            ids = vocab_ids[ids]
        proposal.extra["candidates"] = lambda anchor, allowed: best_first_tree(anchor, logp, ids, allowed,
                                                                               self.budget)
        return proposal


def tree_head(base: nn.Module, block_size: int, budget: int, top_k: int) -> DDTreeHead:
    """The DDTree head for a drafter of `block_size` (budget 0: 2 x the drafter's slots)."""
    return DDTreeHead(base, budget or 2 * (block_size - 1), top_k)
