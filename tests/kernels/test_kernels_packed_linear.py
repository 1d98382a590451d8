"""Which weights kernels/packed_linear.py packs, and how many copies it keeps. Its outputs against F.linear, the
reference: tests/parity/test_parity_linear.py."""

import pytest
import torch

from lilicorr.kernels import packed_linear as P

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")


def _rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5


def test_only_fp32_cpu_weights_pack_and_bf16_when_asked():
    assert P.can_pack(torch.zeros(4, 4))
    assert not P.can_pack(torch.zeros(4, 4, dtype=torch.bfloat16))  # the target's rule: fp32 only
    assert P.can_pack(torch.zeros(4, 4, dtype=torch.bfloat16), bf16=True) == P.bf16_supported()  # the drafter's
    assert not P.can_pack(torch.zeros(4))
    assert not P.can_pack(torch.zeros(4, 4, dtype=torch.float16), bf16=True)
    with pytest.raises(ValueError, match="fp32 or, with CPU support, bf16 CPU matrices only"):
        P.PackedWeight(torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.skipif(not P.bf16_supported(), reason="no native bf16 in oneDNN on this CPU")
def test_bf16_packs_only_when_asked_and_takes_only_bf16_inputs():
    """The bf16 drafter's layers (engine.cpu_drafter_bf16): a bf16 Linear packs at any size, only when asked; a small
    fp32 one beside it stays; only bf16 inputs take its packed path."""
    lin = torch.nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    model = torch.nn.Sequential(lin, torch.nn.Linear(64, 96))  # bf16 and fp32, both below MIN_ELEMENTS
    assert P.pack_linears(model, bf16=False) == 0  # bf16 packs only when asked
    assert P.pack_linears(model, bf16=True) == 1 and model[0].packs()  # any bf16 size; a small fp32 one stays
    assert type(model[1]) is torch.nn.Linear
    x = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        assert P.usable(x, model[0]._current()) and not P.usable(x.float(), model[0]._current())
        assert model[0](x).dtype == torch.bfloat16


def test_one_packed_copy_per_weight_memory():
    """Systems that share a target share its packed weights (views of the same memory included)."""
    w = _rnd(16, 8, seed=1)
    a, b = P.PackedWeight.shared(w), P.PackedWeight.shared(w.detach())
    assert a is b
    assert P.PackedWeight.shared(w[:8]) is not a  # another shape: another matrix
