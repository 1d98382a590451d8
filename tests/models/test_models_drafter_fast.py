"""The scripted drafter forms (models/drafter_fast.py) against the modules, bit for bit, packed layers or not."""

import copy

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.packed_linear import pack_linears
from lilicorr.models import drafter_fast
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _drafter(extra=()):
    cfg = load_config("tiny-random", ["head.kind=none", *extra])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target)).drafter.eval()


def _modules(fn):
    drafter_fast.SCRIPTED = False
    try:
        return fn()
    finally:
        drafter_fast.SCRIPTED = True


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("extra", [(), ("drafter.qk_norm=false",)])
def test_scripted_block_and_context_equal_the_modules(packed, extra):
    d = _drafter(extra)
    if packed:
        d = copy.deepcopy(d)
        assert pack_linears(d, min_elements=0) > 0
    H, B, s = d.hidden_size, d.block_size, d.shape
    g = torch.Generator().manual_seed(1)
    for C, T in [(1, 11), (3, 5)]:
        captured = torch.randn(C, T, s.num_captured * H, generator=g) * 5
        pos = torch.arange(T)[None].expand(C, T) + torch.arange(C)[:, None]
        with torch.no_grad():
            assert drafter_fast.usable(d, captured)
            kv = d.context_kv(captured, pos)
            kv_ref = _modules(lambda: d.context_kv(captured, pos))
            assert all(torch.equal(a, b) and torch.equal(c, e) for (a, c), (b, e) in zip(kv, kv_ref))
            assert all(torch.equal(a, b) for (a, _), (b, _) in
                       zip(kv_ref, d.project_context(d.fuse_context(captured), pos)))
            x = torch.randn(C, B, H, generator=g)
            bpos = pos[:, -1:] + 1 + torch.arange(B)
            valid = torch.rand(C, T, generator=g) < 0.8
            out = d.forward_block(x, bpos, kv, valid)
            ref = _modules(lambda: d.forward_block(x, bpos, kv, valid))
            assert torch.equal(out, ref)


def test_training_keeps_the_modules():
    d = _drafter()
    x = torch.randn(1, d.block_size, d.hidden_size)
    assert not drafter_fast.usable(d, x)  # grad enabled
    with torch.no_grad():
        assert not drafter_fast.usable(d, x.double())
