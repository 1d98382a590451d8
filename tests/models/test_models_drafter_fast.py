"""The scripted drafter forms (models/drafter_fast.py) against the modules, bit for bit, packed layers or not."""

import copy

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.packed_linear import bf16_supported, pack_linears
from lilicorr.models import drafter_fast
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BF16 = pytest.mark.skipif(not bf16_supported(), reason="no native bf16 in oneDNN on this CPU (AVX512-BF16 / AMX)")


def _drafter(extra=()):
    cfg = load_config("tiny-random", ["head.kind=none", *extra])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target)).drafter.eval()


@pytest.mark.parametrize("packed,dtype", [(False, torch.float32), (True, torch.float32),
                                          pytest.param(True, torch.bfloat16, marks=BF16)])
@pytest.mark.parametrize("extra", [(), ("drafter.qk_norm=false",)])
def test_scripted_block_and_context_equal_the_modules(packed, dtype, extra):
    """bf16: the engine's bf16 drafter (engine.cpu_drafter_bf16), its layers on oneDNN's bf16 packed GEMM."""
    d = _drafter(extra).to(dtype)
    if packed:
        d = copy.deepcopy(d)
        assert pack_linears(d, min_elements=0, bf16=dtype == torch.bfloat16) > 0
    H, B, s = d.hidden_size, d.block_size, d.shape
    g = torch.Generator().manual_seed(1)
    for C, T in [(1, 11), (3, 5)]:
        captured = (torch.randn(C, T, s.num_captured * H, generator=g) * 5).to(dtype)
        pos = torch.arange(T)[None].expand(C, T) + torch.arange(C)[:, None]
        with torch.no_grad():
            assert drafter_fast.usable(d, captured)
            kv = d.context_kv(captured, pos)
            kv_ref = d.context(captured, pos, scripted=False)[1]
            assert all(torch.equal(a, b) and torch.equal(c, e) for (a, c), (b, e) in zip(kv, kv_ref))
            assert all(torch.equal(a, b) for (a, _), (b, _) in
                       zip(kv_ref, d.project_context(d.fuse_context(captured), pos)))
            x = torch.randn(C, B, H, generator=g).to(dtype)
            bpos = pos[:, -1:] + 1 + torch.arange(B)
            valid = torch.rand(C, T, generator=g) < 0.8
            out = d.forward_block(x, bpos, kv, valid)
            ref = d.forward_block(x, bpos, kv, valid, scripted=False)
            assert torch.equal(out, ref)


def test_training_keeps_the_modules():
    d = _drafter()
    x = torch.randn(1, d.block_size, d.hidden_size)
    assert not drafter_fast.usable(d, x)  # grad enabled
    with torch.no_grad():
        assert not drafter_fast.usable(d, x, scripted=False)  # the engine's reference backend
    with torch.no_grad():
        assert not drafter_fast.usable(d, x.double())
