"""Parity of the DFlash drafter's inference forms: its context (fuse_context + project_context: the K/V of new target
states) and its block (forward_block over the cached context).

Reference: the drafter's modules, `DFlashDrafter.context(...)` / `forward_block(...)` without a DrafterInference
(drafter_layers.DrafterLayer, F.linear).
Fast path (engine/backend.py: `drafter`): models/drafter_fast.py, each form in one TorchScript call given the engine's
DrafterInference, the modules' ops in the same order: bit-identical on F.linear; on the oneDNN-packed copies the
engine makes (engine.cpu_prepack; packing's own parity is test_parity_linear.py), equal up to oneDNN's summation order.
In fp32 or bf16 (engine.cpu_drafter_bf16: oneDNN's bf16 GEMMs where packed).
Shapes: the tiny test drafter (hidden 64, with and without q/k norms) and SmolLM2-135M's (hidden 576, 9 / 3 heads of
64, FFN 1536, block 8, 4 captured layers: the shipped drafters').
"""

import copy
import functools

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.kernels.packed_linear import bf16_supported
from lilicorr.models import drafter_fast
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BF16 = pytest.mark.skipif(not bf16_supported(), reason="no native bf16 in oneDNN on this CPU (AVX512-BF16 / AMX)")

SHAPES = {"tiny": (), "tiny-no-qk-norm": ("drafter.qk_norm=false",),
          "smollm2": ("target.hidden_size=576", "target.num_heads=9", "target.num_kv_heads=3", "target.head_dim=64",
                      "target.intermediate_size=1536", "drafter.block_size=8", "drafter.num_captured=4",
                      "drafter.feature_scaling=true", "train.feature_cache=true")}
# (packed projections, dtype). Tolerance: none on F.linear (the same ops in the same order); packed, the GEMMs' own
# summation order, through two layers (bf16: its rounding of each layer's output).
PACKED_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=0.1, rtol=0.05)}
BACKENDS = [(False, torch.float32), (True, torch.float32), (False, torch.bfloat16),
            pytest.param(True, torch.bfloat16, marks=BF16)]


@functools.lru_cache(maxsize=None)
def _drafter(shape: str):
    """The shape's random drafter in fp32, made once (callers copy it)."""
    cfg = load_config("tiny-random", ["head.kind=none", *SHAPES[shape]])
    torch.manual_seed(0)
    d = JointModel(cfg, build_random_target(cfg.target)).drafter.eval()
    if cfg.drafter.feature_scaling:  # per-channel scales as training measures them (SmolLM2's run to ~10^4)
        d.set_feature_scale(torch.rand(d.feature_scale.shape, generator=torch.Generator().manual_seed(2)) * 100 + 0.1)
    return d


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("packed,dtype", BACKENDS, ids=["fp32", "fp32-packed", "bf16", "bf16-packed"])
def test_scripted_block_and_context_equal_the_modules(packed, dtype, shape, monkeypatch):
    from lilicorr.kernels import packed_linear

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)  # the tiny drafter's fp32 projections pack like SmolLM2's
    d = copy.deepcopy(_drafter(shape)).to(dtype)
    fast = drafter_fast.DrafterInference(d, prepack=packed)
    assert len(fast.packed) == (1 + 7 * len(d.layers) if packed else 0)

    def same(a, b):
        if packed:
            torch.testing.assert_close(a.float(), b.float(), **PACKED_TOL[dtype])
        else:
            assert torch.equal(a, b)

    H, B, s = d.hidden_size, d.block_size, d.shape
    g = torch.Generator().manual_seed(1)
    for C, T in [(1, 11), (3, 5)]:
        captured = (torch.randn(C, T, s.num_captured * H, generator=g) * 5).to(dtype)
        pos = torch.arange(T)[None].expand(C, T) + torch.arange(C)[:, None]
        with torch.no_grad():
            assert drafter_fast.plain_layers(d) and drafter_fast.usable(d, captured, fast)
            kv = d.context(captured, pos, fast)[1]
            kv_ref = d.context(captured, pos)[1]
            for (a, c), (b, e) in zip(kv, kv_ref):
                same(a, b)
                same(c, e)
            assert all(torch.equal(a, b) for (a, _), (b, _) in
                       zip(kv_ref, d.project_context(d.fuse_context(captured), pos)))
            x = torch.randn(C, B, H, generator=g).to(dtype)
            bpos = pos[:, -1:] + 1 + torch.arange(B)
            valid = torch.rand(C, T, generator=g) < 0.8
            out = d.forward_block(x, bpos, kv_ref, valid, fast)
            ref = d.forward_block(x, bpos, kv_ref, valid)
            same(out, ref)
            assert out.abs().sum() > 0


def test_the_scripted_forms_apply_to_cpu_inference_in_fp32_or_bf16_only():
    d = _drafter("tiny")
    x = torch.randn(1, d.block_size, d.hidden_size)
    fast = drafter_fast.DrafterInference(d, prepack=False)
    assert not drafter_fast.usable(d, x, fast)  # grad enabled: training keeps the modules
    with torch.no_grad():
        assert not drafter_fast.usable(d, x, None)  # the engine's reference backend
        assert not drafter_fast.usable(d, x.double(), fast)
    biased = copy.deepcopy(d)  # a projection the scripted forms do not read as its forward does: the engine's check
    q = biased.layers[0].self_attn.q_proj
    biased.layers[0].self_attn.q_proj = torch.nn.Linear(q.in_features, q.out_features, bias=True)
    assert drafter_fast.plain_layers(d) and not drafter_fast.plain_layers(biased)
