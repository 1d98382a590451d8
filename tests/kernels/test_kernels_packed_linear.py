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
def test_the_drafters_rule_packs_bf16_at_any_size_and_takes_only_bf16_inputs():
    """The bf16 drafter's projections (engine.cpu_drafter_bf16) pack at any size; a small fp32 one does not; only
    bf16 inputs take a bf16 packed weight."""
    w = _rnd(96, 64, seed=4)  # below MIN_ELEMENTS
    assert P.packs_for_drafter(w.to(torch.bfloat16)) and not P.packs_for_drafter(w)
    assert P.packs_for_drafter(torch.zeros(P.MIN_ELEMENTS // 64, 64))  # fp32 from MIN_ELEMENTS: the target's rule
    pw = P.PackedWeight(w.to(torch.bfloat16))
    x = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        assert P.usable(x, pw) and not P.usable(x.float(), pw)
        assert P.packed_linear(x, pw).dtype == torch.bfloat16


def test_one_packed_copy_per_weight_memory():
    """Systems that share a target share its packed weights (views of the same memory included)."""
    w = _rnd(16, 8, seed=1)
    a, b = P.PackedWeight.shared(w), P.PackedWeight.shared(w.detach())
    assert a is b
    assert P.PackedWeight.shared(w[:8]) is not a  # another shape: another matrix
