"""oneDNN on prepacked fp32 CPU weights (kernels/packed_linear.py) against its reference, F.linear."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.kernels import packed_linear as P
from lilicorr.kernels.linear import Projection

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")


def _rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows, bias):
    w, b = _rnd(96, 80, seed=1), (_rnd(96, seed=2) if bias else None)
    x = _rnd(rows, 80, seed=3)
    got = P.packed_linear(x, P.PackedWeight(w), b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, torch.zeros_like(got))


def test_packed_linear_takes_batched_and_strided_inputs():
    w = _rnd(48, 32, seed=1)
    pw = P.PackedWeight(w)
    x3 = _rnd(3, 5, 32, seed=2)  # (C, T, in) like a verification step
    torch.testing.assert_close(P.packed_linear(x3, pw), F.linear(x3, w), rtol=1e-5, atol=1e-5)
    xt = _rnd(32, 6, seed=3).t()  # a transposed (non-contiguous) view
    torch.testing.assert_close(P.packed_linear(xt, pw), F.linear(xt, w), rtol=1e-5, atol=1e-5)


def test_packed_weight_repacks_after_an_in_place_change():
    """An optimizer step or load_state_dict writes the weight in place: the next call must see it."""
    w = _rnd(40, 24, seed=1)
    pw = P.PackedWeight(w)
    x = _rnd(4, 24, seed=2)
    before = P.packed_linear(x, pw)
    with torch.no_grad():
        w.mul_(-2.0)
    torch.testing.assert_close(P.packed_linear(x, pw), -2.0 * before, rtol=1e-5, atol=1e-5)


def test_only_fp32_cpu_weights_pack_and_bf16_when_asked():
    assert P.can_pack(torch.zeros(4, 4))
    assert not P.can_pack(torch.zeros(4, 4, dtype=torch.bfloat16))  # the target's rule: fp32 only
    assert P.can_pack(torch.zeros(4, 4, dtype=torch.bfloat16), bf16=True) == P.bf16_supported()  # the drafter's
    assert not P.can_pack(torch.zeros(4))
    assert not P.can_pack(torch.zeros(4, 4, dtype=torch.float16), bf16=True)
    with pytest.raises(ValueError, match="fp32 or, with CPU support, bf16 CPU matrices only"):
        P.PackedWeight(torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.skipif(not P.bf16_supported(), reason="no native bf16 in oneDNN on this CPU")
def test_bf16_packed_linear_matches_f_linear_in_bf16():
    """The bf16 drafter's layers: oneDNN's bf16 GEMM (fp32 accumulation) against F.linear on the same bf16
    tensors, to bf16's rounding of the output; only bf16 inputs take the packed path."""
    lin = torch.nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    model = torch.nn.Sequential(lin, torch.nn.Linear(64, 96))  # bf16 and fp32, both below MIN_ELEMENTS
    assert P.pack_linears(model, bf16=False) == 0  # bf16 packs only when asked
    assert P.pack_linears(model, bf16=True) == 1 and model[0].packs()  # any bf16 size; a small fp32 one stays
    assert type(model[1]) is torch.nn.Linear
    x = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        out = model[0](x)
        assert P.usable(x, model[0]._current()) and not P.usable(x.float(), model[0]._current())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_one_packed_copy_per_weight_memory():
    """Systems that share a target share its packed weights (views of the same memory included)."""
    w = _rnd(16, 8, seed=1)
    a, b = P.PackedWeight.shared(w), P.PackedWeight.shared(w.detach())
    assert a is b
    assert P.PackedWeight.shared(w[:8]) is not a  # another shape: another matrix


def test_packed_linear_module_is_a_drop_in_for_nn_linear():
    """pack_linears keeps the parameters (state dict unchanged); no-grad fp32 calls take oneDNN, training
    calls F.linear with the same gradients; a cast module falls back to F.linear."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 20), nn.SiLU(), nn.Sequential(nn.Linear(20, 6, bias=False)))
    ref = nn.Sequential(nn.Linear(12, 20), nn.SiLU(), nn.Sequential(nn.Linear(20, 6, bias=False)))
    ref.load_state_dict(model.state_dict())
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    assert P.pack_linears(model) == 0  # small weights stay on MKL (faster below MIN_ELEMENTS)
    assert P.pack_linears(model, min_elements=0) == 2
    assert isinstance(model[0], P.PackedLinear) and isinstance(model[2][0], P.PackedLinear)
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    x = torch.randn(5, 12)
    calls = []
    real = P.packed_linear
    try:
        P.packed_linear = lambda *a: calls.append(1) or real(*a)
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
        assert len(calls) == 2
        calls.clear()
        model(x).sum().backward()  # training: autograd's F.linear, not the packed copy
        assert not calls
    finally:
        P.packed_linear = real
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    model.double()
    with torch.no_grad():
        torch.testing.assert_close(model(x.double()), ref.double()(x.double()))


def test_projection_dispatch():
    """2+ rows: the packed copy; one row, or no packed copy: F.linear (MKL's GEMV), exactly."""
    w, b = _rnd(1024, 256, seed=1), _rnd(1024, seed=2)
    proj, plain = Projection.of(w, b, prepack=True), Projection.of(w, b, prepack=False)
    assert proj.packed is not None and plain.packed is None
    assert Projection.of(w[:8], None, prepack=True).packed is None  # below MIN_ELEMENTS: MKL
    x = _rnd(3, 256, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(proj(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert torch.equal(plain(x), F.linear(x, w, b))  # no copy: exactly MKL
        one = x[:1]
        assert torch.equal(proj(one), F.linear(one, w, b)) and proj.packed_for(1) is None
        assert proj.packed_for(2) is not None and plain.packed_for(2) is None
