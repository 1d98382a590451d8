"""Parity of the lattice match and walk (kernels/lattice.py): the scores sigma * cos of the anchor and of each slot's
out vectors against the next slot's in vectors (Eq. 1), and the greedy (Eq. 8) or Viterbi (Eq. 12) path over them.

Reference: lattice_scores_reference + decode_reference (greedy_walk_reference, viterbi_reference), plain torch; their
own check by hand: tests/kernels/test_kernels_reference.py.
Backends (engine/backend.py: `kernels`): match_and_walk_triton, one fused launch (engine.use_triton) or its split form
((sequence, slot) programs, then the walk), on CUDA, and on CPU through the Triton interpreter (a child process:
interpreted_triton.py). On CPU without the interpreter match_and_walk runs the reference itself. The LiLiCorr head's
own walk (the C kernel) is checked with the head: test_parity_lilicorr_head.py.
Shapes: 1-32 sequences, 3 or 15 slots (Table 4), K 1-16, d 64-1024 (chunked d included). dtypes: fp32, bf16 vectors.
"""

import pytest
import torch

from interpreted_triton import LATTICE_CASES, NO_TRITON, RULES, make_lattice_input, outputs, params
from lilicorr.kernels.lattice import decode_reference, lattice_scores_reference, match_and_walk

# Tolerance of the scores per device, against the reference's fp32 scores:
#   interpreter  the kernel's fp32 (IEEE) dot products sum d in chunks, in another order (~1e-6 relative; sigma = 8)
#   CUDA         bf16 vectors: tensor-core products with fp32 accumulation, in the MMA's order over d = 1024
INTERPRETED_TOL = dict(rtol=1e-5, atol=2e-5)
GPU_TOL = dict(rtol=1e-4, atol=1e-4)


@NO_TRITON
@pytest.mark.parametrize("case", params(LATTICE_CASES))
def test_triton_interpreted_equals_the_reference(case):
    out = outputs(case.slow)
    anchor, pair = lattice_scores_reference(*make_lattice_input(case), 8.0)
    torch.testing.assert_close(out[f"{case.name}/anchor"], anchor, **INTERPRETED_TOL)
    torch.testing.assert_close(out[f"{case.name}/pair"], pair, **INTERPRETED_TOL)
    for rule in RULES:
        path = out[f"{case.name}/{rule}/path"]
        # Exact on the kernel's own scores (same walk, same ties) ...
        assert torch.equal(path, decode_reference(out[f"{case.name}/anchor"], out[f"{case.name}/pair"], rule))
        # ... and on the reference scores (these cases hold no near-ties closer than ~1e-5).
        assert torch.equal(path, decode_reference(anchor, pair, rule)), rule
        # The split form runs the same operations: the same scores and paths, bitwise.
        assert torch.equal(out[f"{case.name}/{rule}/split_path"], path), rule
        assert torch.equal(out[f"{case.name}/{rule}/split_anchor"], out[f"{case.name}/anchor"])
        assert torch.equal(out[f"{case.name}/{rule}/split_pair"], out[f"{case.name}/pair"])
    assert torch.equal(out[f"{case.name}/dispatch_path"], out[f"{case.name}/greedy/path"])
    if case.pattern == "equal":
        assert not out[f"{case.name}/greedy/path"].any() and not out[f"{case.name}/viterbi/path"].any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("c", [1, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rule", RULES)
def test_triton_on_gpu_equals_the_reference(c, dtype, rule):
    """Table 4 sizes: 15 slots, K 8, d 1024."""
    from lilicorr.kernels.lattice_triton import match_and_walk_triton

    g = torch.Generator(device="cuda").manual_seed(c)
    o, i = (torch.randn(c, 15, 8, 1024, device="cuda", generator=g).to(dtype) for _ in range(2))
    a = torch.randn(c, 1024, device="cuda", generator=g).to(dtype)
    path, anchor_sc, pair_sc = match_and_walk_triton(o, i, a, 8.0, rule, write_scores=True)
    anchor, pair = lattice_scores_reference(o, i, a, 8.0)
    torch.testing.assert_close(anchor_sc, anchor, **GPU_TOL)
    torch.testing.assert_close(pair_sc, pair, **GPU_TOL)
    assert torch.equal(path, decode_reference(anchor_sc, pair_sc, rule))
    assert torch.equal(match_and_walk(o, i, a, 8.0, rule), path)
