"""The Triton kernels on a real GPU, at the paper's Table 4 sizes, against their references.

Skipped without CUDA. Also checks that both kernels can be captured in a CUDA graph (the serving
path replays them inside one) and give the same answers on replay.
"""

from __future__ import annotations

import pytest
import torch

from lilicorr.kernels.lattice import RULES, decode_reference, lattice_scores_reference, match_and_walk
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax, topk_logsoftmax_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("n", [15, 480])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [1, 8, 16])
def test_topk_logsoftmax_on_gpu(n, dtype, k):
    g = torch.Generator(device="cuda").manual_seed(n * k)
    x = (3 * torch.randn(n, 151936, device="cuda", generator=g)).to(dtype)
    x[0, :1000] = 2.0  # a block of exact ties at the top
    x[1, ::3] = float("-inf")
    got, ref = topk_logsoftmax(x, k), topk_logsoftmax_reference(x, k)
    assert torch.equal(got.ids, ref.ids)
    torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.features, ref.features, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c", [1, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rule", RULES)
def test_match_and_walk_on_gpu(c, dtype, rule):
    from lilicorr.kernels.lattice_triton import match_and_walk_triton

    g = torch.Generator(device="cuda").manual_seed(c)
    o, i = (torch.randn(c, 15, 8, 1024, device="cuda", generator=g).to(dtype) for _ in range(2))
    a = torch.randn(c, 1024, device="cuda", generator=g).to(dtype)
    path, anchor_sc, pair_sc = match_and_walk_triton(o, i, a, 8.0, rule, write_scores=True)
    anchor, pair = lattice_scores_reference(o, i, a, 8.0)
    torch.testing.assert_close(anchor_sc, anchor, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pair_sc, pair, rtol=1e-4, atol=1e-4)
    assert torch.equal(path, decode_reference(anchor_sc, pair_sc, rule))
    assert torch.equal(match_and_walk(o, i, a, 8.0, rule), path)


def test_kernels_replay_in_a_cuda_graph():
    x = torch.randn(15, 151936, device="cuda").to(torch.bfloat16)
    o, i = torch.randn(2, 1, 15, 8, 1024, device="cuda").to(torch.bfloat16)
    a = torch.randn(1, 1024, device="cuda").to(torch.bfloat16)
    eager_top, eager_path = topk_logsoftmax(x, 8), match_and_walk(o, i, a, 8.0)  # also compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        top, path = topk_logsoftmax(x, 8), match_and_walk(o, i, a, 8.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(top.ids, eager_top.ids) and torch.equal(path, eager_path)
    x.copy_(torch.randn_like(x))  # new inputs in place: the replay must see them
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(top.ids, topk_logsoftmax_reference(x, 8).ids)
