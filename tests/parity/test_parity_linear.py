"""Parity of a linear projection (x @ W.T + b) on the CPU.

Reference: F.linear, in fp32 (bf16 inputs and weights upcast exactly).
Fast path (engine/backend.py: `linear`, `lm_head`): oneDNN on a weight packed once (kernels/packed_linear.py,
engine.cpu_prepack), reached three ways, each a backend below:
  packed_linear   packed_linear() on a PackedWeight: the kernel itself (fp32; bf16 where the CPU has it)
  Projection      kernels/linear.py, the target's projections and LM head: the packed weight at 2+ rows, F.linear
                  (MKL's GEMV) at one row; packs fp32 weights of at least MIN_ELEMENTS only (the target's rule)
  Projection-1row the same with one_row_packed (engine.cpu_one_row): the packed weight at one row too
Shapes: a small layer (96 x 80, below MIN_ELEMENTS) and SmolLM2-135M's (the shipped target and drafter: q/k/v, o,
gate/up, down; the LM head, 49,152 x 576, at a verification block's rows only).
"""

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lilicorr.kernels import packed_linear as P
from lilicorr.kernels.linear import Projection

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")
BF16 = pytest.mark.skipif(not P.bf16_supported(), reason="no native bf16 in oneDNN on this CPU (AVX512-BF16 / AMX)")

# Tolerance per dtype, against fp32 F.linear:
#   fp32  oneDNN sums the products in another order than MKL (blocked, FMA): ~1e-6 relative on these sums
#   bf16  oneDNN's bf16 GEMM accumulates in fp32 and rounds the output to bf16 once (2^-9 relative)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}

# (name, (out, in), rows per call): rows 1 is batch-1 decoding, 2-16 a verification block or batched decoding,
# 200 a prefill chunk
SHAPES = [("small-96x80", (96, 80), (1, 2, 7, 16, 200)),
          ("min_elements-1024x256", (1024, 256), (1, 3)),  # exactly MIN_ELEMENTS: the smallest the target packs
          ("smollm2-qkv", (960, 576), (1, 2, 8, 200)),
          ("smollm2-o", (576, 576), (1, 8)),
          ("smollm2-gate_up", (3072, 576), (1, 8, 200)),
          ("smollm2-down", (576, 1536), (1, 8)),
          ("smollm2-lm_head", (49152, 576), (1, 8))]
BACKENDS = [("packed_linear", torch.float32), pytest.param("packed_linear", torch.bfloat16, marks=BF16),
            ("Projection", torch.float32), ("Projection-1row", torch.float32)]


def _rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5


@functools.lru_cache(maxsize=None)
def _weights(out_f, in_f, dtype):
    """(weight, bias) of a shape, made once for every backend (the LM head's 28M values take a while)."""
    return _rnd(out_f, in_f, seed=1).to(dtype), _rnd(out_f, seed=2).to(dtype)


def reference(x, w, b):
    """The one reference: F.linear in fp32."""
    return F.linear(x.float(), w.float(), None if b is None else b.float())


def _backend(name, w, b):
    """x -> the backend's output, and whether it multiplies by a packed copy for x."""
    if name == "packed_linear":
        pw = P.PackedWeight(w)
        return lambda x: P.packed_linear(x, pw, b), lambda x: True
    proj = Projection.of(w, b, prepack=True, one_row_packed=name == "Projection-1row")
    return proj, lambda x: proj.packed_for(x.numel() // x.shape[-1]) is not None


@pytest.mark.parametrize("name,shape,rows", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("backend,dtype", BACKENDS)
def test_linear_backend_equals_f_linear(backend, dtype, name, shape, rows):
    w, bias_values = _weights(*shape, dtype)
    for bias in (False, True):
        b = bias_values if bias else None
        fn, packs = _backend(backend, w, b)
        for n in rows:
            x = _rnd(n, shape[1], seed=3 + n).to(dtype)
            with torch.no_grad():
                got, ref = fn(x), reference(x, w, b)
                assert got.dtype == dtype
                if backend.startswith("Projection"):
                    # packs weights of MIN_ELEMENTS and more, at 2+ rows (and one with one_row_packed); anything else
                    # is F.linear, exactly
                    assert packs(x) == ((n > 1 or backend == "Projection-1row") and w.numel() >= P.MIN_ELEMENTS)
                    if not packs(x):
                        assert torch.equal(got, F.linear(x, w, b)), (n, bias)
                    plain = Projection.of(w, b, prepack=False, one_row_packed=True)  # engine.cpu_prepack=false: MKL
                    assert plain.packed is None and plain.packed_for(n) is None
                    assert torch.equal(plain(x), F.linear(x, w, b)), (n, bias)
                else:
                    assert packs(x)
            torch.testing.assert_close(got.float(), ref, **TOL[dtype], msg=lambda m: f"rows {n} bias {bias}: {m}")
            assert not torch.equal(got, torch.zeros_like(got))


def test_packed_linear_takes_batched_and_strided_inputs():
    w = _rnd(48, 32, seed=1)
    pw = P.PackedWeight(w)
    x3 = _rnd(3, 5, 32, seed=2)  # (C, T, in) like a verification step
    torch.testing.assert_close(P.packed_linear(x3, pw), reference(x3, w, None), **TOL[torch.float32])
    xt = _rnd(32, 6, seed=3).t()  # a transposed (non-contiguous) view
    torch.testing.assert_close(P.packed_linear(xt, pw), reference(xt, w, None), **TOL[torch.float32])


def test_packed_weight_repacks_after_an_in_place_change():
    """An optimizer step or load_state_dict writes the weight in place: the next call must see it."""
    w = _rnd(40, 24, seed=1)
    pw = P.PackedWeight(w)
    x = _rnd(4, 24, seed=2)
    before = P.packed_linear(x, pw)
    with torch.no_grad():
        w.mul_(-2.0)
    torch.testing.assert_close(P.packed_linear(x, pw), -2.0 * before, **TOL[torch.float32])
    torch.testing.assert_close(P.packed_linear(x, pw), reference(x, w, None), **TOL[torch.float32])


def test_the_packed_path_refuses_autograd_and_other_dtypes():
    """usable(): inference rows of the weight's dtype only; a training call (autograd) or a cast input takes F.linear."""
    w = nn.Parameter(_rnd(20, 12, seed=1))
    pw = P.PackedWeight(w)
    x = _rnd(5, 12, seed=2)
    with torch.no_grad():
        assert P.usable(x, pw) and not P.usable(x.double(), pw) and not P.usable(x[:0], pw)
    assert not P.usable(x, pw)  # grad enabled and the weight requires grad
