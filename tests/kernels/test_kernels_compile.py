"""The Triton kernels compile for an H100/H200 (sm_90) here, without a GPU, and use the hardware well.

The interpreter tests check what the kernels compute; these check what the compiler makes of them:
a cubin at all, no register spills, 16-byte vector loads of the logits, tensor-core products and
asynchronous (pipelined) copies in the lattice kernel. Arguments marked `aligned` are the ones the
JIT marks divisible by 16 at launch for these shapes (V = 151936, d = 1024, contiguous tensors).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from lilicorr.kernels.aot_check import compile_for_cuda  # noqa: E402

TOPK_SIG = {
    "logits_ptr": "*bf16", "stride_row": "i32", "V": "i32", "split_len": "i32", "num_splits": "i32",
    "part_top_ptr": "*i64", "part_m_ptr": "*fp32", "part_s_ptr": "*fp32",
    "ids_ptr": "*i64", "lp_ptr": "*fp32", "feat_ptr": "*fp32",
}
TOPK_ALIGNED = ["logits_ptr", "stride_row", "V", "split_len", "part_top_ptr", "part_m_ptr", "part_s_ptr",
                "ids_ptr", "lp_ptr", "feat_ptr"]


def _lattice_sig(dtype: str) -> dict[str, str]:
    ptrs = {n: f"*{dtype}" for n in ("out_ptr", "in_ptr", "anchor_ptr")}
    ptrs |= {"path_ptr": "*i64", "anchor_sc_ptr": "*fp32", "pair_sc_ptr": "*fp32", "scratch_ptr": "*fp32"}
    ints = {n: "i32" for n in ("so_c", "so_s", "so_k", "si_c", "si_s", "si_k", "sa_c", "S", "K", "D")}
    return ptrs | ints | {"sigma": "fp32", "eps": "fp32"}


LATTICE_ALIGNED = ["out_ptr", "in_ptr", "anchor_ptr", "path_ptr", "anchor_sc_ptr", "pair_sc_ptr", "scratch_ptr",
                   "so_c", "so_s", "so_k", "si_c", "si_s", "si_k", "sa_c", "D"]


def test_topk_kernel_compiles_for_sm90_with_vector_loads():
    from lilicorr.kernels.topk_logsoftmax_triton import _topk_lse_kernel

    info = compile_for_cuda(_topk_lse_kernel, TOPK_SIG, {"K": 8, "KP": 8, "BLOCK": 4096, "SPLIT": False},
                            TOPK_ALIGNED, num_warps=8)
    assert info.local_bytes == 0, "register spills"
    assert 0 < info.registers <= 128  # 8 warps x 128 regs still fits two programs per SM
    assert "ld.global.v4.b32" in info.instructions(r"ld\.global")  # 8 bf16 logits per load


@pytest.mark.slow
def test_topk_split_and_merge_kernels_compile_for_sm90():
    from lilicorr.kernels.topk_logsoftmax_triton import _topk_lse_kernel, _topk_lse_merge_kernel

    info = compile_for_cuda(_topk_lse_kernel, TOPK_SIG, {"K": 16, "KP": 16, "BLOCK": 4096, "SPLIT": True},
                            TOPK_ALIGNED, num_warps=8)
    assert info.local_bytes == 0
    merge_sig = {"part_top_ptr": "*i64", "part_m_ptr": "*fp32", "part_s_ptr": "*fp32", "num_splits": "i32",
                 "ids_ptr": "*i64", "lp_ptr": "*fp32", "feat_ptr": "*fp32"}
    info = compile_for_cuda(_topk_lse_merge_kernel, merge_sig, {"K": 16, "KP": 16, "SP": 32},
                            ["part_top_ptr", "part_m_ptr", "part_s_ptr", "ids_ptr", "lp_ptr", "feat_ptr"])
    assert info.local_bytes == 0


@pytest.mark.parametrize("dtype,viterbi,stage", [("bf16", False, 0), ("bf16", False, 1),
                                                 pytest.param("fp32", True, 0, marks=pytest.mark.slow)])
def test_lattice_kernel_compiles_for_sm90_pipelined(dtype, viterbi, stage):
    """The fused kernel (stage 0) and the split form's scoring launch (stage 1, one slot per program)."""
    from lilicorr.kernels.lattice_triton import _match_walk_kernel

    consts = {"SP": 16, "KP": 16, "BD": 128, "VITERBI": viterbi, "WRITE_SCORES": False, "DOT_FP32": dtype == "fp32",
              "STAGE": stage}
    info = compile_for_cuda(_match_walk_kernel, _lattice_sig(dtype), consts, LATTICE_ALIGNED, num_warps=4, num_stages=3)
    assert info.local_bytes == 0, "register spills"
    assert 0 < info.registers <= 255
    assert info.instructions(r"cp\.async\.cg"), "loads of the (slot, d-chunk) loop are not pipelined"
    if dtype == "bf16":
        assert info.instructions(r"mma\.sync|wgmma"), "bf16 products should run on tensor cores"
