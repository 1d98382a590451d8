"""Fused vocabulary top-K + log-softmax in Triton (paper App. A "Serving"); reference in topk_logsoftmax.py.

One pass over the logits: each program streams a slice of one row in BLOCK-wide chunks (loading one
chunk ahead) and keeps
  - an online max / sum-exp (so log-softmax needs no second pass), and
  - a running top-K, merged with a chunk only when the chunk's max beats the current K-th value,
    and then only for as many steps as the chunk has keys above the K-th (at most K): after the first
    chunks of a row a merge is one or two reductions, not K.

Ranking uses one int64 key per element: the fp32 value mapped to an order-preserving int32 in the
high word and (2^31 - 1 - id) in the low word, so a single integer max picks the largest value and,
among equal values, the lowest id. -inf still ranks above the "empty slot" sentinel (INT64_MIN).

Short rows (batch 1: N = 15) would leave most of the GPU idle, so a row can be split over several
programs; a tiny second kernel then merges the partial (top-K, max, sum-exp) triples per row.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

SENTINEL = tl.constexpr(-(2**63))  # key of an empty top-K slot; below every real value, -inf included
MAXKEY = tl.constexpr(2**63 - 1)  # key of a slot beyond K: never the smallest, never replaced
ID_BASE = tl.constexpr(2**31 - 1)  # low word = ID_BASE - id: larger for lower ids
NUM_FEATURES = 5


@triton.jit
def _pack(x, idx):
    """fp32 values + ids (same shape) -> int64 keys ordered by (value desc, id asc)."""
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # flip magnitude bits of negatives: int order == float order
    return (key.to(tl.int64) << 32) | (idx.to(tl.int64) * -1 + ID_BASE)


@triton.jit
def _unpack(p):
    """int64 keys -> (fp32 values, int64 ids)."""
    key = (p >> 32).to(tl.int32)
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), (p & 0x7FFFFFFF) * -1 + ID_BASE


@triton.jit
def _merge_topk(top, cand, K: tl.constexpr, KP: tl.constexpr):
    """Merge chunk keys cand (BLOCK,) into the unordered top-K keys top (KP,); slots >= K hold MAXKEY.

    Bounded by the number of new candidates: only keys above the current K-th can enter, and at
    most K of them, so the loop runs min(K, #keys above the K-th) times (usually 0-1 after the first
    chunks of a row), each time replacing the smallest kept key by the chunk's best.
    """
    slot = tl.arange(0, KP)
    kth = tl.min(top, 0)
    n_new = tl.minimum(tl.sum((cand > kth).to(tl.int32), 0), K)
    for _ in range(n_new):
        best = tl.max(cand, 0)
        cand = tl.where(cand == best, SENTINEL, cand)  # keys are unique (distinct ids): drops one
        kth = tl.min(top, 0)
        at = tl.min(tl.where(top == kth, slot, KP), 0)  # first slot holding the smallest key
        top = tl.where((slot == at) & (best > kth), best, top)
    return top


@triton.jit
def _sorted_topk(top, K: tl.constexpr, KP: tl.constexpr):
    """The K kept keys in descending order, SENTINEL in slots >= K (the layout _write_row expects)."""
    slot = tl.arange(0, KP)
    top = tl.where(slot < K, top, SENTINEL)
    out = tl.full([KP], SENTINEL, tl.int64)
    for i in tl.static_range(K):
        best = tl.max(top, 0)
        out = tl.where(slot == i, best, out)
        top = tl.where(top == best, SENTINEL, top)
    return out


@triton.jit
def _write_row(top, m, s, row, ids_ptr, lp_ptr, feat_ptr, K: tl.constexpr, KP: tl.constexpr):
    """Decode the row's top-K keys and write ids, log-probs and the five features."""
    slot = tl.arange(0, KP)
    ok = slot < K
    val, idx = _unpack(top)
    lp = val - (m + tl.log(s))  # log_softmax = x - logsumexp(row)
    top_lp = tl.max(tl.where(slot == 0, lp, float("-inf")), 0)
    if K > 1:
        rank_frac = slot.to(tl.float32) / (K - 1)
    else:
        rank_frac = tl.zeros([KP], tl.float32)
    is_top = (slot == 0).to(tl.float32)
    out = row * K + slot
    tl.store(ids_ptr + out, idx, mask=ok)
    tl.store(lp_ptr + out, lp, mask=ok)
    f = feat_ptr + out * 5
    tl.store(f + 0, lp, mask=ok)
    tl.store(f + 1, tl.exp(lp), mask=ok)
    tl.store(f + 2, lp - top_lp, mask=ok)
    tl.store(f + 3, rank_frac, mask=ok)
    tl.store(f + 4, is_top, mask=ok)


@triton.jit
def _topk_lse_kernel(
    logits_ptr, stride_row, V, split_len, num_splits,
    part_top_ptr, part_m_ptr, part_s_ptr,  # (N, num_splits, KP), (N, num_splits) x2; when SPLIT
    ids_ptr, lp_ptr, feat_ptr,  # final outputs; when not SPLIT
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    start = split * split_len
    end = tl.minimum(start + split_len, V)
    offs = tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    top = tl.where(tl.arange(0, KP) < K, SENTINEL, MAXKEY)  # unordered while streaming; MAXKEY: unused slot
    m = float("-inf")  # running max
    s = tl.zeros([BLOCK], tl.float32)  # per-lane running sum of exp(x - m): one reduction at the end
    kth = float("-inf")  # value of the K-th kept candidate
    kth_key = tl.min(top, 0)  # SENTINEL while fewer than K are kept
    # Prefetch one chunk ahead: the next load is in flight while this chunk is reduced.
    x_next = tl.load(row_ptr + start + offs, mask=start + offs < end, other=float("-inf"))
    for off in range(start, end, BLOCK):
        idx = off + offs
        inside = idx < end
        x = x_next.to(tl.float32) + 0.0  # + 0.0 folds -0.0 into +0.0 (they tie, like in torch)
        x_next = tl.load(row_ptr + BLOCK + idx, mask=BLOCK + idx < end, other=float("-inf"))
        cmax = tl.max(x, 0)
        m_new = tl.maximum(m, cmax)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: avoid -inf - -inf
        s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
        m = m_new
        # Strictly greater: an equal value further right has a higher id and loses the tie.
        if (cmax > kth) | (kth_key == SENTINEL):
            cand = tl.where(inside, _pack(x, idx), SENTINEL)
            top = _merge_topk(top, cand, K, KP)
            kth_key = tl.min(top, 0)
            kth = _unpack(kth_key)[0]
    s = tl.sum(s, 0)
    top = _sorted_topk(top, K, KP)
    if SPLIT:
        part = row * num_splits + split
        tl.store(part_top_ptr + part * KP + tl.arange(0, KP), top)
        tl.store(part_m_ptr + part, m)
        tl.store(part_s_ptr + part, s)
    else:
        _write_row(top, m, s, row, ids_ptr, lp_ptr, feat_ptr, K, KP)


@triton.jit
def _topk_lse_merge_kernel(
    part_top_ptr, part_m_ptr, part_s_ptr, num_splits,
    ids_ptr, lp_ptr, feat_ptr,
    K: tl.constexpr, KP: tl.constexpr, SP: tl.constexpr,
):
    row = tl.program_id(0)
    sp = tl.arange(0, SP)
    slot = tl.arange(0, KP)
    live = sp < num_splits
    part = row * num_splits + sp
    m_parts = tl.load(part_m_ptr + part, mask=live, other=float("-inf"))  # (SP,)
    s_parts = tl.load(part_s_ptr + part, mask=live, other=0.0)
    m = tl.max(m_parts, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_parts * tl.exp(m_parts - m_safe), 0)
    cand = tl.load(
        part_top_ptr + part[:, None] * KP + slot[None, :], mask=live[:, None], other=SENTINEL
    )  # (SP, KP)
    top = tl.full([KP], SENTINEL, tl.int64)
    for i in tl.static_range(K):
        best = tl.max(tl.max(cand, 1), 0)
        top = tl.where(slot == i, best, top)
        cand = tl.where(cand == best, SENTINEL, cand)
    _write_row(top, m, s, row, ids_ptr, lp_ptr, feat_ptr, K, KP)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pick_num_splits(n_rows: int, n_chunks: int, device: torch.device) -> int:
    """Enough programs to fill the GPU (2 per SM fit at 8 warps x 128 registers) without splitting
    rows needlessly: batch 32 (480 rows) runs one program per row, batch 1 (15 rows) ~13 per row."""
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(n_chunks, triton.cdiv(2 * sms, max(n_rows, 1))))


def topk_logsoftmax_triton(
    logits: Tensor, k: int, num_splits: int | None = None, block: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """logits (N, V) fp32/bf16/fp16 -> ids (N, K) int64, logprobs (N, K) fp32, features (N, K, 5)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (N, V), got {tuple(logits.shape)}")
    n, v = logits.shape
    if not 1 <= k <= min(v, 64):
        raise ValueError(f"k={k} must lie in [1, min(V={v}, 64)]")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    ids = torch.empty((n, k), dtype=torch.int64, device=dev)
    lps = torch.empty((n, k), dtype=torch.float32, device=dev)
    feats = torch.empty((n, k, NUM_FEATURES), dtype=torch.float32, device=dev)
    if n == 0:
        return ids, lps, feats
    kp = max(2, triton.next_power_of_2(k))
    # 4096-wide chunks on GPU; under the CPU interpreter each op is a numpy call, so take big ones.
    block = block or max(kp, min(4096 if dev.type == "cuda" else 65536, triton.next_power_of_2(v)))
    n_chunks = triton.cdiv(v, block)
    want = num_splits or _pick_num_splits(n, n_chunks, dev)
    split_len = triton.cdiv(n_chunks, max(1, min(want, n_chunks))) * block  # whole chunks per split
    splits = triton.cdiv(v, split_len)
    warps = 8 if block >= 4096 else 4
    if splits == 1:
        _topk_lse_kernel[(n, 1)](
            logits, logits.stride(0), v, split_len, 1, ids, lps, lps, ids, lps, feats,
            K=k, KP=kp, BLOCK=block, SPLIT=False, num_warps=warps,
        )
        return ids, lps, feats
    part_top = torch.empty((n, splits, kp), dtype=torch.int64, device=dev)
    part_m = torch.empty((n, splits), dtype=torch.float32, device=dev)
    part_s = torch.empty((n, splits), dtype=torch.float32, device=dev)
    _topk_lse_kernel[(n, splits)](
        logits, logits.stride(0), v, split_len, splits, part_top, part_m, part_s, ids, lps, feats,
        K=k, KP=kp, BLOCK=block, SPLIT=True, num_warps=warps,
    )
    _topk_lse_merge_kernel[(n,)](
        part_top, part_m, part_s, splits, ids, lps, feats,
        K=k, KP=kp, SP=max(2, triton.next_power_of_2(splits)), num_warps=4,
    )
    return ids, lps, feats
