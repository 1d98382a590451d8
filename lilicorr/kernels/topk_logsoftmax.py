"""Vocabulary top-K + log-softmax: the candidate pool of each drafted slot (paper §3.2, App. A).

For every row of logits (N, V) return the K most likely token ids, their log-probabilities under
the full-vocabulary softmax, and the five confidence features App. A feeds the head:
    [logprob, prob, logprob - slot max logprob, rank / (K-1), is_top]

`topk_logsoftmax_reference` is plain torch and differentiable w.r.t. the logits (training keeps the
ids fixed and back-propagates through the log-probabilities, §3.4). `topk_logsoftmax` dispatches to
the fused Triton kernel (one pass over the logits) on CUDA tensors, or on CPU tensors when
TRITON_INTERPRET=1 is set; otherwise `topk_logsoftmax_fast` (the reference's outputs bit for bit, cheaper
top-k). It is for inference only.

Ties: equal logits are ordered by the lower token id first, in both implementations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lilicorr.kernels.dispatch import use_triton

NUM_FEATURES = 5
KEY_ELEMENTS = 1 << 24  # elements per block of rows whose exact top-k keys are built at once (~0.5 GB of temporaries)
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


def _topk_ids_lower_id_first(x: Tensor, k: int, key_elements: int = KEY_ELEMENTS) -> Tensor:
    """Exact top-k ids of fp32 rows (N, V): descending value, equal values -> lower id first.

    torch.topk does not promise which of several equal values it keeps or their order. Its values are
    exact, though, and every element above the k-th value is among them; only the places taken by values
    equal to the k-th are open, and they go to the lowest ids of that value (a second topk, over int32
    scores that are larger for lower ids where x equals it). The k are then put in order by one int64 key
    each (value, then id; _order_keys), as the Triton kernel ranks them. No host sync (the engine's blocks
    never read the device) and several times cheaper than one int64 key per element (_topk_ids_by_keys, the
    reference the tests compare with) for a block's 7 slots x 49,152 on 2 CPU cores (docs/results.md, "CPU fast
    paths").
    key_elements: elements per block of rows (KEY_ELEMENTS; tests pass fewer to run several blocks).
    """
    if x.shape[0] == 0:
        return torch.empty(0, k, dtype=torch.long, device=x.device)
    lowest_first = torch.arange(x.shape[-1], 0, -1, device=x.device, dtype=torch.int32)  # (V,)
    j = torch.arange(k, device=x.device)[None, :]
    rows = max(1, key_elements // max(1, x.shape[-1]))  # bounded temporaries (training chunks at V = 151,936)
    out = []
    for i in range(0, x.shape[0], rows):
        xb = x[i:i + rows]
        vals, ids = torch.topk(xb, k, dim=-1)  # (n, K) sorted by value; equal values in any order
        kth = vals[:, -1:]
        above = (vals > kth).sum(-1, keepdim=True)  # (n, 1): the first `above` places are settled
        ties = torch.topk(torch.where(xb == kth, lowest_first, 0), k, dim=-1).indices  # lowest ids == k-th
        ids = torch.where(j < above, ids, ties.gather(1, (j - above).clamp_min(0)))
        order = torch.argsort(_order_keys(xb.gather(1, ids), ids), dim=-1, descending=True)
        out.append(ids.gather(1, order))
    return torch.cat(out) if len(out) > 1 else out[0]


def _order_keys(vals: Tensor, ids: Tensor) -> Tensor:
    """int64 keys ordering (value desc, id asc) when sorted descending: the fp32 bits as an order-preserving
    int32 in the high word, (2^31 - 1 - id) in the low word."""
    bits = vals.contiguous().view(torch.int32)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip magnitude bits -> int order
    return (key.to(torch.int64) << 32) | ((2**31 - 1) - ids)


def _topk_ids_by_keys(x: Tensor, k: int) -> Tensor:
    """The exact top-k ids by one int64 key per element (see _order_keys), a block of rows at a time."""
    low = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    # The int64 keys and their temporaries cost ~32 bytes per element: build them for a block of rows at a time
    # (at V = 151,936 a training chunk of 2,048 rows would otherwise hold ~10 GB of them).
    rows = max(1, KEY_ELEMENTS // max(1, x.shape[-1]))
    out = [torch.topk(_order_keys(x[i:i + rows], low.expand(x[i:i + rows].shape)), k, dim=-1).indices
           for i in range(0, x.shape[0], rows)]  # (rows, K) each
    return torch.cat(out) if len(out) > 1 else out[0]


CHUNK = 64  # columns per chunk of _topk_ids_chunked


def _topk_ids_chunked(x: Tensor, k: int) -> Tensor:
    """The same ids as _topk_ids_lower_id_first (its reference), through the maxima of chunks of CHUNK columns.

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
        return _topk_ids_lower_id_first(x + 0.0, k)
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
    x = logits.float() + 0.0  # + 0.0 folds -0.0 into +0.0 so the two tie like in the kernel
    ids = _topk_ids_lower_id_first(x.detach(), k)  # (N, K) int64
    logprobs = torch.gather(torch.log_softmax(x, dim=-1), 1, ids)  # (N, K)
    return TopKLogProbs(ids, logprobs, candidate_features(logprobs))


def topk_logsoftmax(logits: Tensor, k: int, num_splits: int | None = None) -> TopKLogProbs:
    """Dispatch: fused Triton kernel on CUDA (or TRITON_INTERPRET=1), topk_logsoftmax_fast otherwise (no grad),
    the reference when a gradient is wanted.

    Inference only: when a gradient is wanted (or k > 64) we fall back to the reference. `num_splits` (Triton
    only) forces how many programs share one row; None picks it from the device size.
    """
    wants_grad = torch.is_grad_enabled() and logits.requires_grad
    if use_triton(logits) and not wants_grad and k <= MAX_TRITON_K:
        from lilicorr.kernels.topk_logsoftmax_triton import topk_logsoftmax_triton

        ids, logprobs, features = topk_logsoftmax_triton(logits, k, num_splits=num_splits)
        return TopKLogProbs(ids, logprobs, features)
    if not wants_grad and logits.dim() == 2 and 1 <= k <= logits.shape[-1]:
        return topk_logsoftmax_fast(logits, k)
    return topk_logsoftmax_reference(logits, k)


def topk_logsoftmax_fast(logits: Tensor, k: int) -> TopKLogProbs:
    """The reference's outputs, bit for bit, without its full-row copy and partial sorts (inference, CPU):
    ids by _topk_ids_chunked, log-probs from the same log_softmax; several times cheaper than the reference for a
    block's 7 x 49,152 (docs/results.md, "CPU fast paths")."""
    x = logits.detach().float()
    ids = _topk_ids_chunked(x, k)  # (N, K)
    logprobs = torch.log_softmax(x, dim=-1).gather(1, ids)  # -0.0 and +0.0 give the same log-softmax
    return TopKLogProbs(ids, logprobs, candidate_features(logprobs))
