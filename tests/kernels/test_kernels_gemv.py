"""The compiled CPU GEMV against its reference (F.linear), and where `linear` uses it (kernels/gemv.py)."""

import pytest
import torch
import torch.nn.functional as F

from lilicorr.kernels import gemv as G


@pytest.mark.parametrize("out_f,in_f", [(7, 5), (960, 576), (576, 1536), (4099, 64)])
def test_gemv_equals_f_linear(out_f, in_f):
    g = torch.Generator().manual_seed(out_f)
    x, w, b = torch.randn(1, in_f, generator=g), torch.randn(out_f, in_f, generator=g), torch.randn(out_f, generator=g)
    with torch.no_grad():
        y = G.gemv(x, w, strict=True)
        yb = G.gemv(x, w, b, strict=True)
    ref = F.linear(x, w)
    assert y.shape == (1, out_f)
    # fp32 sums of in_f products in another order: relative error ~ in_f * eps
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * in_f ** 0.5)
    torch.testing.assert_close(yb, ref + b, rtol=1e-5, atol=1e-5 * in_f ** 0.5)
    assert not torch.equal(y, torch.zeros_like(y))


def test_gemv_takes_one_row_only():
    with pytest.raises(ValueError, match="one row"):
        G.gemv(torch.randn(2, 4), torch.randn(3, 4))


def test_projection_uses_the_gemv_only_for_one_fp32_row_without_grad(monkeypatch):
    from lilicorr.kernels import linear as L

    calls = []
    real = G.gemv
    monkeypatch.setattr(L, "gemv", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    w = torch.randn(G.MIN_ELEMENTS // 64, 64)
    proj = L.Projection(w)  # no packed copy: 2+ rows take F.linear (MKL)
    with torch.no_grad():
        one = torch.randn(1, 1, 64)
        y = proj(one, fast_gemv=True)
        assert y.shape == (1, 1, w.shape[0]) and calls == [(1, 64)]
        two = torch.randn(1, 2, 64)
        assert torch.equal(proj(two, fast_gemv=True), F.linear(two, w))  # 2 rows: MKL, bitwise
        assert torch.equal(proj(one, fast_gemv=False), F.linear(one, w))
        assert torch.equal(L.Projection(w.double())(one.double(), fast_gemv=True), F.linear(one.double(), w.double()))
        small = w[:8]  # below MIN_ELEMENTS: cache-resident, F.linear is cheaper than the compiled call
        assert torch.equal(L.Projection(small)(one, fast_gemv=True), F.linear(one, small))
    x = torch.randn(1, 64, requires_grad=True)
    proj(x, fast_gemv=True).sum().backward()  # training keeps autograd's F.linear
    assert calls == [(1, 64)] and x.grad is not None


def test_one_compiled_graph_serves_every_weight_shape():
    """Dynamo stops compiling a function after a few recompiles and silently runs it eagerly (a (out, in)
    temporary per call): the dynamic-shape GEMV must not recompile per weight shape."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for out_f, in_f in [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 64), (200, 96), (33, 17)]:
            G.gemv(torch.randn(1, in_f), torch.randn(out_f, in_f), strict=True)
    assert counters["stats"]["unique_graphs"] - before <= 1
