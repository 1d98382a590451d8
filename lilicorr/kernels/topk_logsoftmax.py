"""Vocabulary top-K + log-softmax: the candidate pool of each drafted slot (paper §3.2, App. A).

For every row of logits (N, V) return the K most likely token ids, their log-probabilities under
the full-vocabulary softmax, and the five confidence features App. A feeds the head:
    [logprob, prob, logprob - slot max logprob, rank / (K-1), is_top]

`topk_logsoftmax_reference` is plain torch and differentiable w.r.t. the logits (training keeps the
ids fixed and back-propagates through the log-probabilities, §3.4); its ranking (`topk_ids`) is exact and
cheap on CPU. `topk_logsoftmax` dispatches to the fused Triton kernel (one pass over the logits, inference
only) on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 is set; otherwise to the reference.

Ties: equal logits are ordered by the lower token id first, in both implementations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lilicorr.kernels.dispatch import use_triton

NUM_FEATURES = 5
KEY_ELEMENTS = 1 << 24  # elements per block of rows whose int64 keys are built at once (~0.5 GB of temporaries)
MAX_TRITON_K = 64  # the kernel keeps its running top-K in registers


class TopKLogProbs(NamedTuple):
    ids: Tensor  # (N, K) int64, descending by logit, ties -> lower id first
    logprobs: Tensor  # (N, K) float32, log_softmax over the full vocabulary
    features: Tensor  # (N, K, 5) float32, see module docstring


def candidate_features(logprobs: Tensor) -> Tensor:
    """(N, K) log-probs sorted descending -> (N, K, 5) confidence features of App. A."""
    n, k = logprobs.shape
    rank = torch.arange(k, device=logprobs.device, dtype=torch.float32)
    rank_frac = rank / (k - 1) if k > 1 else torch.zeros_like(rank)
    is_top = (rank == 0).to(torch.float32)
    gap = logprobs - logprobs[:, :1]  # <= 0; the top candidate carries the slot max
    return torch.stack(
        [
            logprobs,
            logprobs.exp(),
            gap,
            rank_frac.expand(n, k),
            is_top.expand(n, k),
        ],
        dim=-1,
    )


def _order_keys(vals: Tensor, ids: Tensor) -> Tensor:
    """int64 keys ordering (value desc, id asc) when sorted descending: the fp32 bits as an order-preserving
    int32 in the high word, (2^31 - 1 - id) in the low word."""
    bits = vals.contiguous().view(torch.int32)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip magnitude bits -> int order
    return (key.to(torch.int64) << 32) | ((2**31 - 1) - ids)


def _topk_ids_by_keys(x: Tensor, k: int) -> Tensor:
    """The exact top-k ids by one int64 key per element (see _order_keys), a block of rows at a time: what
    _topk_ids_chunked falls back to for the shapes it does not take."""
    if x.shape[0] == 0:
        return torch.empty(0, k, dtype=torch.long, device=x.device)
    low = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    # The int64 keys and their temporaries cost ~32 bytes per element: build them for a block of rows at a time
    # (at V = 151,936 a training chunk of 2,048 rows would otherwise hold ~10 GB of them).
    rows = max(1, KEY_ELEMENTS // max(1, x.shape[-1]))
    out = [torch.topk(_order_keys(x[i:i + rows], low.expand(x[i:i + rows].shape)), k, dim=-1).indices
           for i in range(0, x.shape[0], rows)]  # (rows, K) each
    return torch.cat(out) if len(out) > 1 else out[0]


CHUNK = 64  # columns per chunk of _topk_ids_chunked


def _topk_ids_chunked(x: Tensor, k: int) -> Tensor:
    """The exact top-k ids (descending value, equal values -> lower id first) through the maxima of chunks of CHUNK
    columns; rows whose width is not a multiple of CHUNK (or holds fewer than k chunks), and non-fp32 rows, go to
    _topk_ids_by_keys.

    Why: on CPU a torch.topk over a 49,152-wide row is a partial sort, a max over chunks one streaming pass, an
    order of magnitude cheaper for the 7 slots of a block on 2 cores (docs/results.md, "CPU fast paths"). Exact,
    ties included: order elements by (value desc, id asc) and chunks by their best element, i.e. (chunk max desc,
    chunk index asc), since a lower chunk holds only lower ids. A top-k element's chunk is among the top-k chunks
    (else k chunks would each hold an element ranked above it), so the top-k of the k * CHUNK columns of those
    chunks are the answer. Both rankings are by _order_keys (exact), over (N, V / CHUNK) and (N, k * CHUNK)
    elements. -0.0 ranks as +0.0 (the + 0.0 folds it, as the reference's does), so x need not be copied.
    """
    x = x.contiguous()
    n, v = x.shape
    if v % CHUNK or v // CHUNK < k or n == 0 or x.dtype != torch.float32:
        return _topk_ids_by_keys(x.float() + 0.0, k)
    maxima = x.view(n, v // CHUNK, CHUNK).amax(-1) + 0.0  # (N, V / CHUNK)
    chunk_ids = torch.arange(v // CHUNK, device=x.device, dtype=torch.int64)
    chunks = torch.topk(_order_keys(maxima, chunk_ids.expand(n, -1)), k, dim=-1).indices  # (N, k) best chunks
    cols = (chunks[:, :, None] * CHUNK + torch.arange(CHUNK, device=x.device)).reshape(n, k * CHUNK)  # (N, k*CHUNK)
    best = torch.topk(_order_keys(x.gather(1, cols) + 0.0, cols), k, dim=-1).indices  # (N, k), ordered
    return cols.gather(1, best)


def topk_ids(logits: Tensor, k: int) -> Tensor:
    """The top-k column ids of logits (N, V), no grad, with the kernels' order (descending, ties -> lower id)."""
    return _topk_ids_chunked(logits.detach().float(), k)


def topk_logsoftmax_reference(logits: Tensor, k: int) -> TopKLogProbs:
    """Plain-torch reference. logits (N, V) fp32/bf16; differentiable w.r.t. logits."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (N, V), got {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k={k} must lie in [1, V={logits.shape[-1]}]")
    x = logits.float()  # no copy of fp32 logits; the ranking folds -0.0 into +0.0 (they tie, as in the kernel)
    ids = topk_ids(x, k)  # (N, K) int64; no gradient flows through the ranking (§3.4)
    logprobs = torch.gather(torch.log_softmax(x, dim=-1), 1, ids)  # (N, K)
    return TopKLogProbs(ids, logprobs, candidate_features(logprobs))


def topk_logsoftmax(logits: Tensor, k: int, num_splits: int | None = None) -> TopKLogProbs:
    """Dispatch: the fused Triton kernel on CUDA (or TRITON_INTERPRET=1) when no gradient is wanted and k <= 64,
    else the reference. `num_splits` (Triton only) forces how many programs share one row; None picks it from the
    device size."""
    wants_grad = torch.is_grad_enabled() and logits.requires_grad
    if use_triton(logits) and not wants_grad and k <= MAX_TRITON_K:
        from lilicorr.kernels.topk_logsoftmax_triton import topk_logsoftmax_triton

        ids, logprobs, features = topk_logsoftmax_triton(logits, k, num_splits=num_splits)
        return TopKLogProbs(ids, logprobs, features)
    return topk_logsoftmax_reference(logits, k)
