"""LiLiCorr decode rules over the candidate lattice, batched over sequences: greedy walk (Eq. 8), Viterbi (App. E).

The scoring and the walks live in `lilicorr.kernels.lattice` (torch references + a fused Triton launch);
this module turns a walk's candidate indices into committed tokens and scores a path (Eq. 12).
"""

from __future__ import annotations

from torch import Tensor

from lilicorr.kernels.lattice import match_and_walk

__all__ = ["path_score", "commit_tokens", "decode_tokens"]


def path_score(anchor_scores: Tensor, pair_scores: Tensor, path: Tensor) -> Tensor:
    """Eq. 12: g(c) = anchor[c_1] + sum_s pair[s-1, c_{s-1}, c_s] for path (C, S) -> (C,)."""
    total = anchor_scores.gather(1, path[:, :1])[:, 0]
    if pair_scores.shape[1] > 0:
        prev = path[:, :-1, None, None].expand(-1, -1, 1, pair_scores.shape[-1])  # (C, S-1, 1, K)
        rows = pair_scores.gather(2, prev)[:, :, 0]  # (C, S-1, K)
        total = total + rows.gather(2, path[:, 1:, None])[..., 0].sum(1)
    return total


def commit_tokens(cand_ids: Tensor, path: Tensor) -> Tensor:
    """cand_ids (C, S, K), path (C, S) candidate indices -> committed tokens (C, S) int64."""
    return cand_ids.gather(-1, path[..., None])[..., 0]


def decode_tokens(cand_ids: Tensor, out_vecs: Tensor, in_vecs: Tensor, anchor_out: Tensor, sigma: float,
                  rule: str = "greedy") -> Tensor:
    """Vectors -> committed token per slot (C, S); one fused launch on CUDA (match + walk)."""
    return commit_tokens(cand_ids, match_and_walk(out_vecs, in_vecs, anchor_out, sigma, rule))
