"""Verification of a candidate chain or tree in one target pass: lossless at every temperature.

Walk from the anchor: at node n, the target's distribution p_n for the next token decides which child
(if any) is accepted; the walk stops at the first node where none is, and the next token is drawn
there from the residual distribution. Per row, all on device, no host sync; the loop has a fixed
number of iterations (N - 1) so the step keeps static shapes.

Deterministic proposals (a token chosen without randomness, or a tree's children at one node, tried
in node order): accept child x_i with probability p(x_i) / (1 - sum_{j<i} p(x_j)); if all are rejected,
sample from p with every child removed and renormalised. For one child this is "accept x with
probability p(x), else sample from p without x". Children of a node must carry distinct tokens.

Sampled proposals (the child's token drawn from q, chain only): accept with min(1, p(x)/q(x)), else
sample from max(p - q, 0) renormalised (standard speculative sampling).

Greedy rows use one-hot p (sampling.target_probs), which turns both rules into "accept iff the token is
the target's argmax; the next token is the argmax where the walk stops". `verify_greedy` is that rule on
the logits directly, for a step whose rows are all greedy: the same verdict without the (C, N, V)
softmax, one-hot, residual and sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .candidates import Candidates
from .sampling import sample_with_uniform


@dataclass
class Verdict:
    path: torch.Tensor  # (C, N) accepted nodes in order, path[:, 0] = 0 (anchor); entries > num_accepted unused
    num_accepted: torch.Tensor  # (C,) accepted draft nodes (0 .. N-1)
    next_token: torch.Tensor  # (C,) bonus (all accepted) or residual sample (a rejection)
    stop_node: torch.Tensor  # (C,) node where the walk stopped


def verify(p: torch.Tensor, cands: Candidates, uniforms: torch.Tensor, q: Optional[torch.Tensor] = None) -> Verdict:
    """p (C, N, V): target distribution after each node. uniforms (C, N, 2): [:, j, 0] decides node j's
    acceptance, [:, n, 1] draws the next token if the walk stops at node n. q (C, N, V) or None: the
    distribution node j's token was sampled from (sampled proposals; chain only)."""
    c, n, _ = p.shape
    if q is not None and not cands.is_chain:
        raise ValueError("sampled proposals are verified as a chain only")
    dev = p.device
    rows = torch.arange(c, device=dev)
    node_ids = torch.arange(n, device=dev)[None, :]
    valid = node_ids < cands.num_nodes[:, None]  # (C, N)
    tokens, parents = cands.tokens, cands.parents
    qx = None if q is None else q.gather(2, tokens[:, :, None])[..., 0]  # (C, N) q_j(x_j)

    cur = torch.zeros(c, dtype=torch.long, device=dev)
    alive = torch.ones(c, dtype=torch.bool, device=dev)
    num_acc = torch.zeros(c, dtype=torch.long, device=dev)
    path = torch.zeros(c, n, dtype=torch.long, device=dev)
    for _ in range(n - 1):
        children = (parents == cur[:, None]) & valid & alive[:, None]  # (C, N)
        px = p[rows, cur].gather(1, tokens)  # (C, N) target prob of each node's token after `cur`
        if qx is None:
            pc = px * children
            prior = pc.cumsum(1) - pc  # mass of the earlier (rejected) siblings
            ratio = px / (1.0 - prior).clamp_min(1e-12)
        else:
            ratio = px / qx.clamp_min(1e-12)
        accepted = children & (uniforms[..., 0] < ratio)  # (C, N)
        moved = accepted.any(1)
        first = accepted.float().argmax(1)  # first accepted child in node order
        cur = torch.where(moved, first, cur)
        num_acc = num_acc + moved.long()
        path[rows, num_acc] = torch.where(moved, first, path[rows, num_acc])
        alive = moved

    p_stop = p[rows, cur]  # (C, V)
    children = (parents == cur[:, None]) & valid  # (C, N) all rejected (or none)
    if q is None:
        removed = torch.zeros_like(p_stop).scatter_add_(1, tokens, children.to(p_stop.dtype))  # (C, V)
        residual = p_stop * (1.0 - removed.clamp(max=1.0))
    else:
        has_child = children.any(1)
        child = children.float().argmax(1)
        q_child = q[rows, child] * has_child[:, None]
        residual = (p_stop - q_child).clamp_min(0.0)
    empty = residual.sum(-1, keepdim=True) <= 0  # p == q numerically: fall back to p itself
    residual = torch.where(empty, p_stop, residual)
    next_token = sample_with_uniform(residual, uniforms[rows, cur, 1])
    return Verdict(path=path, num_accepted=num_acc, next_token=next_token, stop_node=cur)


def verify_greedy(logits: torch.Tensor, cands: Candidates) -> Verdict:
    """`verify` for rows that are all greedy, from the logits (C, N, V): node j's child is accepted iff its
    token is the target's argmax after node j (children carry distinct tokens, so at most one is); the next
    token is the argmax where the walk stops. Equal to verify(target_probs(logits, 0), cands, any uniforms)."""
    c, n, _ = logits.shape
    dev = logits.device
    best = logits.argmax(-1)  # (C, N) the target's greedy token after each node
    rows = torch.arange(c, device=dev)
    valid = torch.arange(n, device=dev)[None, :] < cands.num_nodes[:, None]  # (C, N)
    if cands.is_chain:
        return _greedy_chain(best, cands.tokens, valid)
    cur = torch.zeros(c, dtype=torch.long, device=dev)
    alive = torch.ones(c, dtype=torch.bool, device=dev)
    num_acc = torch.zeros(c, dtype=torch.long, device=dev)
    path = torch.zeros(c, n, dtype=torch.long, device=dev)
    for _ in range(n - 1):
        hit = (cands.parents == cur[:, None]) & valid & alive[:, None] & (cands.tokens == best[rows, cur][:, None])
        moved = hit.any(1)
        cur = torch.where(moved, hit.float().argmax(1), cur)
        num_acc = num_acc + moved.long()
        path[rows, num_acc] = torch.where(moved, cur, path[rows, num_acc])
        alive = moved
    return Verdict(path=path, num_accepted=num_acc, next_token=best[rows, cur], stop_node=cur)


def _greedy_chain(best: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> Verdict:
    """verify_greedy's walk on a chain, without the walk: node j (parent j - 1) is accepted iff every node up to
    it matches the argmax after its parent, so the accepted count is the length of the all-true prefix of
    `match` (a cumulative product) — ~10 ops instead of ~10 per node, the same verdict (tests/engine/test_engine_verify.py).
    best, tokens (C, N); valid (C, N) bool."""
    c, n = tokens.shape
    match = (tokens[:, 1:] == best[:, :-1]) & valid[:, 1:]  # (C, N - 1)
    num_acc = match.long().cumprod(1).sum(1)  # (C,)
    nodes = torch.arange(n, device=tokens.device)[None, :]
    path = nodes * (nodes <= num_acc[:, None])  # (C, N): 0 .. num_acc, then 0 (unused) like the walk's
    return Verdict(path=path, num_accepted=num_acc, next_token=best.gather(1, num_acc[:, None])[:, 0], stop_node=num_acc)
