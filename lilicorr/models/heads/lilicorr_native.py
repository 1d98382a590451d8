"""The LiLiCorr head's greedy batch-1 proposal through one C call (kernels/native/lilicorr_head.c).

What it computes: the whole proposal (exact top-K, the five features, the target projection, the lattice pass, the
fused and unit-norm vectors, the greedy walk), what LiLiCorrHead.propose's modules compute for that row. Why C: inside
the engine the same computation through PyTorch (its modules, a TorchScript or an Inductor-compiled call) pays for framework
code and buffers that the target's pass before it has just flushed from the caches; the C kernel reads only its
tables and a few KB of code (figures and the command: docs/results.md). The engine asks for it (engine.cpu_native_head,
engine/backend.py) through the HeadInference it passes to `propose`; training and direct calls run the modules. One
greedy fp32 row on CPU only, else the head's modules run.

The kernel's tables (a _Plan, kept in the decoder's HeadInference, never on the head) are made from the head's
parameters once: every Linear's weight packed in panels of 16 outputs, in bf16 where all of them are bf16 values (a
shipped export, loaded from bf16: exact), embed_proj of every column's embedding (a block gathers its S*K rows instead
of projecting them), the out/in heads stacked and the attention biases, in one huge-page-backed buffer. Every
RECHECK-th call compares the parameters with the plan's stamp (their storage, in-place version and shape) and remakes
it if one changed: an optimizer step or a load reaches the kernel within RECHECK proposals. Checking every call would
read 49 tensors' metadata, cold after the target's pass, a noticeable share of the call (docs/results.md, "CPU fast
paths"); drafts from weights a few blocks old cost acceptance at worst, never correctness (the target verifies them).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

import torch.nn.functional as F

from lilicorr.kernels.native import NativeLibrary, huge_page_buffer
from lilicorr.models.heads import lilicorr_inference
from lilicorr.models.heads.lilicorr_inference import HeadInference

_P = ctypes.c_void_p
RECHECK = 32  # calls between two comparisons of the parameters with the plan's stamp
MAX_SIDE = 64  # slots and candidates the kernel's stack arrays hold


def _declare(lib) -> None:
    lib.lilicorr_scratch_floats.argtypes, lib.lilicorr_scratch_floats.restype = [_P], ctypes.c_int64
    lib.lilicorr_propose_one_row.argtypes, lib.lilicorr_propose_one_row.restype = [_P] * 11, None


_LIB = NativeLibrary("lilicorr_head.c", "native batch-1 LiLiCorr head", "the head's modules", _declare)
_LOCAL = threading.local()  # each thread's scratch buffer (a decoder may run in a server thread)


def available() -> bool:
    return _LIB.get() is not None


def one_row_args(head, S: int, tables: HeadInference) -> tuple:
    """(the kernel's head-side arguments: (proj, proj_eps, K, w, layers, layernorm, ln_eps, num_heads, eps, sigma),
    the tensors the tables derive from), gathered once per decoder and slot count (reading ~60 attributes every block
    cost a noticeable share of the call: docs/results.md, "CPU fast paths"): the head's and the target's Parameter
    objects, so in-place updates are seen by the stamps."""
    found = tables.native_args
    if found is None or found[0] != S:
        w, layers, _rms_embed, *options = lilicorr_inference.options(head, S, head.K, tables)  # rms_embed: in one_row_tables
        fused = head.choices["target"] == "fused"
        proj = [head.target_proj.weight, head.target_proj.bias, head.target_norm.weight] if fused else []
        eps = float(head.target_norm.eps) if fused else 1e-6
        sources = [t for b in head.lattice.layer_biases() for t in (b.slot_distance, b.same_slot)]
        sources += [t for m in (head.embed_proj, head.out_head, head.in_head) for t in (m.weight, m.bias)]
        found = tables.native_args = (S, (proj, eps, head.K, w, layers, *options), [*sources, head._target.embed_weight])
    return found[1], found[2]


def one_row_tables(head, S: int, vocab_ids: Optional[Tensor], sources: List[Tensor], tables: HeadInference):
    """(embed_nodes (V', W), [out_in weight (2d, W), bias (2d,)], each lattice layer's attention bias (heads, S*K, S*K)),
    kept per parameter version. embed_nodes: embed_proj of the (normalised, "rms") target embedding of every logit
    column (the draft vocabulary's tokens, or all). sources: from one_row_args, the target's embedding table last."""
    table = sources[-1]
    ep, oh, ih = head.embed_proj, head.out_head, head.in_head

    def build():
        emb = head.candidate_embedding(table if vocab_ids is None else table[vocab_ids])
        nodes = F.linear(emb.to(ep.weight.dtype), ep.weight, ep.bias)
        out_in = [torch.cat([oh.weight, ih.weight]), torch.cat([oh.bias, ih.bias])]
        return nodes, out_in, lilicorr_inference.attention_biases(head, S, head.K, tables)

    return tables.derived("one_row", (S,), sources if vocab_ids is None else [*sources, vocab_ids], build)


@dataclass
class _Plan:
    key: tuple  # (S, V, has_proj, the ids' storage)
    stamp: tuple  # the sources' (storage, version, shape) when it was made
    buffer: Tensor  # every table, one allocation
    ids: Optional[Tensor]  # the columns' token ids, int64
    c_args: tuple  # (weight table, dims, options) addresses: the kernel's head-side arguments
    scratch_floats: int
    arrays: tuple  # the ctypes arrays c_args points into (pointers, dims, options), kept alive here
    calls: int = 0


def _panels(w: Tensor) -> Tensor:
    """A Linear's weight (out, in) in the kernel's layout: panels of 16 outputs, (ceil(out / 16), in, 16), the last
    padded with zeros (lilicorr_head.c: linear)."""
    out, inp = w.shape
    padded = w.detach().new_zeros(-(-out // 16) * 16, inp)
    padded[:out] = w.detach()
    return padded.view(-1, 16, inp).transpose(1, 2).contiguous()


def _is_bf16(w: Tensor) -> bool:
    return bool(torch.equal(w, w.to(torch.bfloat16).to(w.dtype)))


def _table(head, S: int, vocab_ids: Optional[Tensor], has_proj: bool, args: tuple, sources: List[Tensor],
           tables: HeadInference) -> Tuple[List[Tensor], bool]:
    """(the kernel's weight table (lilicorr_head.c: W_* then L_* per layer), whether its panels are bf16) from
    one_row_args' (args, sources)."""
    proj, _eps, _k, w, layers, *_ = args
    embed_nodes, out_in, biases = one_row_tables(head, S, vocab_ids, sources, tables)
    linears = [w[2], w[6], w[8], w[13], out_in[0], w[19], *([proj[0]] if has_proj else [])]
    linears += [p[i] for p in layers for i in (1, 3, 8, 10)]
    bf16 = all(_is_bf16(x) for x in linears)

    def pack(x: Tensor) -> Tensor:
        x = _panels(x)
        return x.to(torch.bfloat16) if bf16 else x

    unused = w[0].new_zeros(1)
    ln = [w[4], w[5]] if isinstance(head.feature_norm, torch.nn.LayerNorm) else [unused, unused]
    tproj = [pack(proj[0]), proj[1], proj[2]] if has_proj else [unused, unused, unused]
    table = [embed_nodes, pack(w[2]), w[3], *ln, pack(w[6]), w[7], pack(w[8]), w[9], w[10], w[11], w[12],
             pack(w[13]), w[14], pack(out_in[0]), out_in[1], pack(w[19]), w[20], *tproj]
    for p, bias in zip(layers, biases):
        table += [p[0], pack(p[1]), p[2], pack(p[3]), p[4], bias, p[7], pack(p[8]), p[9], pack(p[10]), p[11]]
    return [x.detach() for x in table], bf16


def _pack_flat(tensors: List[Tensor]) -> Tuple[Tensor, List[int]]:
    """The tensors copied into one huge-page buffer, each at a 64-byte boundary -> (buffer, their addresses)."""
    offsets, size = [], 0
    for x in tensors:
        offsets.append(size)
        size += -(-x.numel() * x.element_size() // 64) * 64
    buf = huge_page_buffer(size)
    for x, off in zip(tensors, offsets):
        nbytes = x.numel() * x.element_size()
        buf[off:off + nbytes].view(x.dtype).copy_(x.reshape(-1))
    return buf, [buf.data_ptr() + off for off in offsets]


def _build(head, tables: HeadInference, lib, key: tuple, stamp: tuple, vocab_ids: Optional[Tensor]) -> _Plan:
    S, V, has_proj, _ids = key
    args, sources = one_row_args(head, S, tables)
    table, bf16 = _table(head, S, vocab_ids, has_proj, args, sources, tables)
    proj, proj_eps, K, w, layers, layernorm, ln_eps, num_heads, layer_eps, sigma = args
    ffn = layers[0][8].shape[0] if layers else 0
    dims = (ctypes.c_int32 * 13)(S, V, K, w[2].shape[1], proj[0].shape[1] if has_proj else 0, w[2].shape[0],
                                 w[19].shape[0], num_heads, len(layers), ffn, int(has_proj), int(layernorm), int(bf16))
    opts = (ctypes.c_float * 4)(proj_eps, ln_eps, layer_eps, sigma)
    buffer, addresses = _pack_flat(table)
    ptrs = (ctypes.c_void_p * len(table))(*addresses)
    ids = None if vocab_ids is None else vocab_ids.to(torch.int64).contiguous()
    return _Plan(key, stamp, buffer, ids, (ctypes.addressof(ptrs), ctypes.addressof(dims), ctypes.addressof(opts)),
                 lib.lilicorr_scratch_floats(ctypes.addressof(dims)), (ptrs, dims, opts))


def _sources(head, tables: HeadInference, vocab_ids: Optional[Tensor]) -> List[Tensor]:
    """Every tensor the tables derive from: the head's parameters, the target's embedding, the columns' ids."""
    found = tables.native_sources
    if found is None or found[0] is not vocab_ids:
        extra = [] if vocab_ids is None else [vocab_ids]
        found = tables.native_sources = (vocab_ids, [*head.parameters(), head._target.embed_weight, *extra])
    return found[1]


def plan_for(head, tables: HeadInference, lib, S: int, V: int, has_proj: bool, vocab_ids: Optional[Tensor]) -> _Plan:
    """The current plan for (S, V, has_proj) in `tables`, made or remade when stale (see the module doc)."""
    plan = tables.native_plan
    key = (S, V, has_proj, None if vocab_ids is None else vocab_ids.data_ptr())
    if plan is not None and plan.key == key:
        plan.calls += 1
        if plan.calls < RECHECK:
            return plan
        plan.calls = 0
        stamp = lilicorr_inference.stamp(_sources(head, tables, vocab_ids))
        if stamp == plan.stamp:
            return plan
    else:
        stamp = lilicorr_inference.stamp(_sources(head, tables, vocab_ids))
    with torch.no_grad():
        plan = tables.native_plan = _build(head, tables, lib, key, stamp, vocab_ids)
    return plan


def _usable(head, logits: Tensor) -> bool:
    if logits.dtype != torch.float32 or head.embed_proj.weight.dtype != torch.float32:
        return False
    return logits.shape[1] <= MAX_SIDE and head.K <= MAX_SIDE and logits.shape[2] >= head.K


def _f32(x: Tensor) -> Tensor:
    # attribute checks, not ops: every op dispatched costs tens of µs cold inside the engine
    if x.dtype != torch.float32:
        x = x.float()
    return x if x.is_contiguous() else x.contiguous()


def propose_one_row(head, tables: HeadInference, logits: Tensor, vocab_ids: Optional[Tensor], slot_hidden: Tensor,
                    target_state: Tensor, context_state: Optional[Tensor], walk_scores: Optional[Tensor] = None
                    ) -> Optional[Tuple[Tensor, Tensor]]:
    """(tokens (1, S), candidates (1, S, K)) of a greedy LiLiCorrHead for one row, as its modules commit them, or None
    where the kernel cannot run here (no compiler, not fp32, too many slots). tables: the decoder's HeadInference
    (the kernel's plan lives there). walk_scores: a (1, S, K) fp32 tensor to receive the scores each pick of the
    walk chose from (tests)."""
    if not _usable(head, logits):
        return None
    lib = _LIB.get()
    if lib is None:
        return None
    S, V = logits.shape[1], logits.shape[2]
    has_proj = context_state is not None and head.reads_context_state
    plan = plan_for(head, tables, lib, S, V, has_proj, vocab_ids)
    state = _f32(context_state if has_proj else head.target_projection(target_state, context_state))
    logits, slot_hidden = _f32(logits), _f32(slot_hidden)
    tokens = torch.empty(1, S, dtype=torch.int64)
    cand = torch.empty(1, S, head.K, dtype=torch.int64)
    lib.lilicorr_propose_one_row(logits.data_ptr(), None if plan.ids is None else plan.ids.data_ptr(),
                                 slot_hidden.data_ptr(), state.data_ptr(), *plan.c_args, _scratch(plan.scratch_floats),
                                 tokens.data_ptr(), cand.data_ptr(),
                                 None if walk_scores is None else walk_scores.data_ptr())
    return tokens, cand


def _scratch(floats: int) -> int:
    """The address of this thread's scratch buffer of at least `floats` fp32 values."""
    buf = getattr(_LOCAL, "scratch", None)
    if buf is None or buf.numel() < floats * 4:
        buf = _LOCAL.scratch = huge_page_buffer(floats * 4)
        _LOCAL.address = buf.data_ptr()
    return _LOCAL.address
