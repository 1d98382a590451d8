"""Training blocks: where anchors go, and what each block's slots are supervised with.

Anchors are drawn per sequence among positions i >= 1 with loss_mask[i] and loss_mask[i+1] (the anchor
needs a target state before it, and at least its first slot must be supervised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


def sample_anchors(loss_mask: Tensor, num_anchors: int, generator: Optional[torch.Generator] = None):
    """loss_mask (N, T) bool -> anchors (N, A) int64 ascending, anchor_valid (N, A) bool.

    Up to A distinct positions per sequence, uniformly at random among the eligible ones; sequences
    with fewer eligible positions get invalid (padding) anchors at position 1.
    """
    m = loss_mask.bool()
    N, T = m.shape
    eligible = torch.zeros_like(m)
    eligible[:, 1:T - 1] = m[:, 1:T - 1] & m[:, 2:T]
    A = min(num_anchors, T)
    noise = torch.rand(N, T, generator=generator, device=generator.device if generator is not None else m.device)
    noise = noise.to(m.device).masked_fill(~eligible, -1.0)
    top = noise.topk(A, dim=1)
    valid = top.values >= 0
    anchors = torch.where(valid, top.indices, torch.ones_like(top.indices))
    order = torch.argsort(torch.where(valid, anchors, T + anchors), dim=1)  # valid ones first, ascending
    return anchors.gather(1, order), valid.gather(1, order)


@dataclass
class BlockTargets:
    labels: Tensor  # (N, A, S) int64 token at anchor + s (s = 1..S); 0 where out of range
    valid: Tensor  # (N, A, S) bool
    predictor_pos: Tensor  # (N, A, S) position whose target logits predict slot s: anchor + s - 1


def block_targets(input_ids: Tensor, loss_mask: Tensor, anchors: Tensor, anchor_valid: Tensor,
                  block_size: int) -> BlockTargets:
    N, T = input_ids.shape
    S = block_size - 1
    pos = anchors[:, :, None] + torch.arange(1, S + 1, device=anchors.device)  # (N, A, S)
    inside = pos < T
    pos_c = pos.clamp_max(T - 1)
    flat = pos_c.flatten(1)
    labels = input_ids.gather(1, flat).view_as(pos)
    valid = inside & loss_mask.bool().gather(1, flat).view_as(pos) & anchor_valid[:, :, None]
    return BlockTargets(labels=torch.where(inside, labels, 0), valid=valid, predictor_pos=pos_c - 1)
