"""What the target verifies in one pass: candidate nodes with a parent structure.

Node 0 is the anchor (the last committed token, whose KV is not in the cache yet). Every other node
is a draft token whose parent is an earlier node. The linear block of DFlash is the chain case
(parent of node j is j-1); a tree of candidates (DDTree) is any other parent array. Verification
(verify.py) and the target's attention mask (ancestor_mask) only read this structure, so a tree needs
no new verifier: only a proposer that fills `parents` differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Candidates:
    tokens: torch.Tensor  # (C, N) node tokens; node 0 is the anchor
    parents: torch.Tensor  # (C, N) parent node index, -1 for node 0 (entries >= num_nodes are ignored)
    num_nodes: torch.Tensor  # (C,) valid nodes per row, >= 1
    is_chain: bool = True  # parents[j] == j - 1 for all j: lets the engine skip KV compaction

    @property
    def size(self) -> int:
        return self.tokens.shape[1]


def chain(anchor: torch.Tensor, drafts: torch.Tensor, num_proposed: torch.Tensor) -> Candidates:
    """The linear block [anchor, d_1 .. d_S] with num_proposed (C,) drafts valid per row."""
    tokens = torch.cat([anchor[:, None], drafts], dim=1)  # (C, S + 1)
    n = tokens.shape[1]
    parents = (torch.arange(n, device=tokens.device) - 1)[None, :].expand(tokens.shape[0], -1)
    return Candidates(tokens=tokens, parents=parents, num_nodes=num_proposed + 1, is_chain=True)


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(C, N, N) bool: node i may attend to node j iff j is i or an ancestor of i (parents (C, N)).

    Parents precede their children (parents[i] < i), so one pass in node order suffices.
    """
    c, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(c, n, n).clone()
    for i in range(1, n):
        p = parents[:, i].clamp(min=0)  # (C,)
        mask[:, i] |= mask[torch.arange(c, device=parents.device), p]
    return mask


def depths(parents: torch.Tensor) -> torch.Tensor:
    """(C, N) depth of each node (anchor 0): its RoPE offset from the anchor's position."""
    c, n = parents.shape
    d = torch.zeros(c, n, dtype=torch.long, device=parents.device)
    for i in range(1, n):
        d[:, i] = d.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0] + 1
    return d
