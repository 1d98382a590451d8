"""LiLiCorr match + walk in Triton (paper Eq. 1, 8, 12); references in lattice.py.

Fused form: one launch, one program per sequence. It first scores the whole lattice,
    table[j, k, k'] = sigma * cos(prev[j, k], in[j, k'])      j = 0 .. S-1
where prev[0] is the anchor's single out vector (row k = 0 only) and prev[j] = out[j - 1] after it,
then walks it: greedy (Eq. 8) or Viterbi (Eq. 12, App. E). Ties go to the lowest index exactly as in
the references, because both walks run the same float operations on the same scores.

Scoring the full K x K table costs S K^2 d multiply-adds (1M at Table 4 sizes) but has no dependent
loads; a greedy walk that only scored the K successors of the committed candidate would instead wait
on one memory round trip per slot. The table comes from one flat loop over (slot, d-chunk) of small
tl.dot products ((16, BD) x (BD, 16); K is padded to 16) -- the shape Triton's software pipeliner
overlaps with the loads of the next chunks. The squared norms are the diagonals of two more
products, so every per-chunk value stays in the tensor-core layout; each finished slot is parked in
a small scratch buffer (L2-resident) and read back for the walk. bf16 inputs multiply exactly and
accumulate in fp32; fp32 inputs use IEEE products (no TF32), so scores match the reference to ~1e-6
and the walks agree exactly except on near-ties closer than that.
Split form (small batch): the scoring runs as one program per (sequence, slot), the walk as a second launch
of one program per sequence reading the scratch tables: the same operations, so the same paths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lilicorr.kernels.lattice import COS_EPS


@triton.jit
def _argmax_first(x, idx, NONE: tl.constexpr):
    """Index (from idx) of the first maximum of a 1-D x."""
    return tl.min(tl.where(x == tl.max(x, 0), idx, NONE), 0)


@triton.jit
def _match_walk_kernel(
    out_ptr, in_ptr, anchor_ptr, path_ptr, anchor_sc_ptr, pair_sc_ptr, scratch_ptr,
    so_c, so_s, so_k, si_c, si_s, si_k, sa_c,  # strides; the last dim is contiguous
    S, K, D, sigma, eps,
    SP: tl.constexpr, KP: tl.constexpr, BD: tl.constexpr,
    VITERBI: tl.constexpr, WRITE_SCORES: tl.constexpr, DOT_FP32: tl.constexpr, STAGE: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    jj = tl.arange(0, SP)
    kk = tl.arange(0, KP)
    dd = tl.arange(0, BD)
    k_ok = kk < K
    j3 = jj[:, None, None]  # (SP, 1, 1)
    # scratch[c, j]: rows 0..KP-1 the dot products <prev[j, k], in[j, k']>, row KP the squared
    # norms of prev[j], row KP + 1 those of in[j]. (SP, KP + 2, KP) fp32 per sequence.
    scratch = scratch_ptr + c * (SP * (KP + 2) * KP)
    diag = kk[:, None] == kk[None, :]

    # ---- parallel stage: one flat loop over (slot, d-chunk) so the loads pipeline across slots.
    # Everything per iteration stays in the tl.dot layout: the norms are the diagonals of two more
    # (tensor-core) products; a slot's results go to scratch once, after its last chunk.
    # STAGE 0 (fused) scores every slot and walks; the split form launches STAGE 1 over (sequence, slot), one
    # slot per program (more programs than sequences at small batch), then STAGE 2 over sequences to walk.
    if STAGE != 2:
        n_chunks = tl.cdiv(D, BD)
        if STAGE == 1:
            t_lo = tl.program_id(1) * n_chunks
            t_hi = t_lo + n_chunks
        else:
            t_lo = 0
            t_hi = S * n_chunks
        acc = tl.zeros([KP, KP], tl.float32)
        acc_prev = tl.zeros([KP, KP], tl.float32)
        acc_in = tl.zeros([KP, KP], tl.float32)
        for t in range(t_lo, t_hi):
            j = t // n_chunks
            chunk = t % n_chunks
            d = chunk * BD + dd
            d_ok = d < D
            x_in = tl.load(
                in_ptr + c * si_c + j * si_s + kk[:, None] * si_k + d[None, :],
                mask=k_ok[:, None] & d_ok[None, :], other=0.0,
            )  # (KP, BD)
            # prev[0] is the anchor's single out vector (row 0); prev[j] = out[j - 1] after it.
            prev_ptrs = tl.where(
                j == 0,
                anchor_ptr + c * sa_c + kk[:, None] * 0 + d[None, :],
                out_ptr + c * so_c + (j - 1) * so_s + kk[:, None] * so_k + d[None, :],
            )
            row_ok = tl.where(j == 0, kk == 0, k_ok)
            x_prev = tl.load(prev_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (KP, BD)
            keep = (chunk > 0).to(tl.float32)  # a new slot starts from zero
            acc = acc * keep
            acc_prev = acc_prev * keep
            acc_in = acc_in * keep
            if DOT_FP32:  # fp32 inputs (or the CPU interpreter): IEEE products, no TF32 rounding
                x_in = x_in.to(tl.float32)
                x_prev = x_prev.to(tl.float32)
                acc = tl.dot(x_prev, tl.trans(x_in), acc, input_precision="ieee")  # (KP, KP)
                acc_prev = tl.dot(x_prev, tl.trans(x_prev), acc_prev, input_precision="ieee")
                acc_in = tl.dot(x_in, tl.trans(x_in), acc_in, input_precision="ieee")
            else:  # bf16 / fp16 on GPU: tensor cores, exact products, fp32 accumulation
                acc = tl.dot(x_prev, tl.trans(x_in), acc)
                acc_prev = tl.dot(x_prev, tl.trans(x_prev), acc_prev)
                acc_in = tl.dot(x_in, tl.trans(x_in), acc_in)
            if chunk == n_chunks - 1:  # the slot is complete: park its products in scratch
                slot = scratch + j * ((KP + 2) * KP)
                tl.store(slot + kk[:, None] * KP + kk[None, :], acc)
                tl.store(slot + KP * KP + kk[:, None] + kk[None, :] * 0, acc_prev, mask=diag)
                tl.store(slot + (KP + 1) * KP + kk[:, None] + kk[None, :] * 0, acc_in, mask=diag)
    if STAGE == 0:
        tl.debug_barrier()  # the whole program's scratch stores land before it reads them back
    if STAGE != 1:  # walk (fused, or the split's second launch once every slot is scored)
        k_row = kk[None, :, None]
        k_col = kk[None, None, :]
        live = j3 < S
        dots = tl.load(scratch + j3 * ((KP + 2) * KP) + k_row * KP + k_col, mask=live, other=0.0)  # (SP, KP, KP)
        sq_prev = tl.load(scratch + jj[:, None] * ((KP + 2) * KP) + KP * KP + kk[None, :], mask=jj[:, None] < S, other=0.0)
        sq_in = tl.load(scratch + jj[:, None] * ((KP + 2) * KP) + (KP + 1) * KP + kk[None, :], mask=jj[:, None] < S, other=0.0)
        n_prev = tl.maximum(tl.sqrt(sq_prev), eps)  # norms clamped at eps, like cosine_similarity
        n_in = tl.maximum(tl.sqrt(sq_in), eps)
        table = sigma * dots / (n_prev[:, :, None] * n_in[:, None, :])  # (SP, KP, KP), Eq. 1
        row_ok3 = tl.where(j3 == 0, k_row == 0, k_row < K)
        valid = live & row_ok3 & (k_col < K)
        table = tl.where(valid, table, float("-inf"))
        if WRITE_SCORES:
            tl.store(anchor_sc_ptr + c * K + k_col + (k_row + j3) * 0, table, mask=valid & (j3 == 0))
            pair = pair_sc_ptr + (((c * (S - 1) + (j3 - 1)) * K + k_row) * K + k_col)
            tl.store(pair, table, mask=valid & (j3 > 0))

        # ---- sequential stage: walk the lattice ----
        path = tl.zeros([SP], tl.int64)
        if VITERBI:
            best = tl.where(kk == 0, 0.0, float("-inf"))  # best path score ending at each candidate
            back = tl.zeros([SP, KP], tl.int32)  # back[j, k']: predecessor of k' on its best path
            for j in range(0, S):
                total = best[:, None] + tl.sum(tl.where(j3 == j, table, 0.0), 0)  # (KP prev, KP next)
                best = tl.max(total, 0)
                arg = tl.min(tl.where(total == best[None, :], kk[:, None], KP), 0)  # first maximum
                back = tl.where(jj[:, None] == j, arg[None, :], back)
            cur = _argmax_first(tl.where(k_ok, best, float("-inf")), kk, KP)
            for r in range(0, S):
                j = S - 1 - r
                path = tl.where(jj == j, cur.to(tl.int64), path)
                hit = (jj == j)[:, None] & (kk == cur)[None, :]
                cur = tl.sum(tl.sum(tl.where(hit, back, 0), 1), 0)
        else:
            cur = tl.zeros([], tl.int32)  # the anchor's single out vector, row 0
            for j in range(0, S):
                hit = (j3 == j) & (kk == cur)[None, :, None]
                row = tl.sum(tl.sum(tl.where(hit, table, 0.0), 0), 0)  # (KP,) = table[j, cur, :]
                cur = _argmax_first(tl.where(k_ok, row, float("-inf")), kk, KP)
                path = tl.where(jj == j, cur.to(tl.int64), path)
        tl.store(path_ptr + c * S + jj, path, mask=jj < S)


SPLIT_BELOW = 16  # sequences: below this many the split form keeps more of the GPU's SMs busy


def _chunk_width(d: int, device: torch.device) -> int:
    """d-chunk of each tl.dot: 128 on GPU (two (16, 128) tiles per step, pipelined); under the CPU
    interpreter every op is a numpy call, so one chunk spans the whole of d."""
    if device.type != "cuda":
        return max(16, triton.next_power_of_2(d))
    return max(16, min(128, triton.next_power_of_2(d)))


def match_and_walk_triton(
    out_vecs: Tensor, in_vecs: Tensor, anchor_out: Tensor, sigma: float,
    rule: str = "greedy", write_scores: bool = False, block_d: int | None = None, split: bool | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(C, S, K, d) x2 + (C, d) -> path (C, S) int64 [, anchor (C, K), pair (C, S-1, K, K) fp32].

    write_scores also returns the scores the kernel walked (tests, diagnostics); block_d forces the
    d-chunk width (a power of two; tests use it to exercise the GPU chunking under the interpreter).
    split: score over (sequence, slot) programs, then walk in a second launch -- at small batch one program
    per sequence would leave most of the GPU idle. None: split on CUDA below SPLIT_BELOW sequences.
    """
    if out_vecs.dim() != 4 or in_vecs.shape != out_vecs.shape:
        raise ValueError(f"out/in must both be (C, S, K, d), got {tuple(out_vecs.shape)}, {tuple(in_vecs.shape)}")
    n_seq, s, k, d = out_vecs.shape
    if anchor_out.shape != (n_seq, d):
        raise ValueError(f"anchor_out must be (C, d) = {(n_seq, d)}, got {tuple(anchor_out.shape)}")
    out_vecs, in_vecs, anchor_out = (t if t.stride(-1) == 1 else t.contiguous() for t in (out_vecs, in_vecs, anchor_out))
    # tl.dot wants one operand dtype; the anchor shares a load with the out vectors.
    in_vecs, anchor_out = in_vecs.to(out_vecs.dtype), anchor_out.to(out_vecs.dtype)
    dev = out_vecs.device
    path = torch.empty((n_seq, s), dtype=torch.int64, device=dev)
    anchor_sc = pair_sc = None
    if write_scores:
        anchor_sc = torch.empty((n_seq, k), dtype=torch.float32, device=dev)
        pair_sc = torch.empty((n_seq, max(s - 1, 0), k, k), dtype=torch.float32, device=dev)
    if n_seq == 0 or s == 0:
        return path, anchor_sc, pair_sc
    kp = max(16, triton.next_power_of_2(k))  # tl.dot needs >= 16 rows and columns
    sp = max(2, triton.next_power_of_2(s))
    scratch = torch.empty((n_seq, sp, kp + 2, kp), dtype=torch.float32, device=dev)
    if split is None:
        split = dev.type == "cuda" and n_seq < SPLIT_BELOW
    args = (out_vecs, in_vecs, anchor_out, path,
            anchor_sc if write_scores else path, pair_sc if write_scores else path, scratch,
            out_vecs.stride(0), out_vecs.stride(1), out_vecs.stride(2),
            in_vecs.stride(0), in_vecs.stride(1), in_vecs.stride(2), anchor_out.stride(0),
            s, k, d, float(sigma), COS_EPS)
    meta = dict(SP=sp, KP=kp, BD=block_d or _chunk_width(d, dev), VITERBI=(rule == "viterbi"),
                WRITE_SCORES=write_scores,
                DOT_FP32=(out_vecs.dtype == torch.float32 or dev.type != "cuda"),  # interpreter: no bf16 dot
                num_warps=4, num_stages=3)
    if split:
        _match_walk_kernel[(n_seq, s)](*args, STAGE=1, **meta)
        _match_walk_kernel[(n_seq,)](*args, STAGE=2, **meta)
    else:
        _match_walk_kernel[(n_seq,)](*args, STAGE=0, **meta)
    return path, anchor_sc, pair_sc
