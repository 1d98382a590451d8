"""The Triton kernels captured in a CUDA graph (the serving path replays them inside one) give the same answers on
replay, new inputs included. Skipped without CUDA. The kernels against their references on the GPU, at the paper's
Table 4 sizes: tests/parity/test_parity_topk_features.py and test_parity_walk.py.
"""

from __future__ import annotations

import pytest
import torch

from lilicorr.kernels.lattice import match_and_walk
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax, topk_logsoftmax_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


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
