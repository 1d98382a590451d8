"""The compiled one-row decoder layer (engine/one_row_layer.py) against the eager layer_step it replaces."""

import pytest
import torch

from lilicorr.engine import one_row_layer as R
from lilicorr.engine.layer import LayerShape, LayerWeights, layer_step
from lilicorr.kernels.linear import Projection


def _layer_inputs(nq, nkv, hd, hidden, inter, bias, qk_norm, seed=0, cap=40):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    w = LayerWeights(qkv=Projection(rnd((nq + 2 * nkv) * hd, hidden), rnd((nq + 2 * nkv) * hd) if bias else None),
                     o=Projection(rnd(hidden, nq * hd), rnd(hidden) if bias else None),
                     gate_up=Projection(rnd(2 * inter, hidden)), down=Projection(rnd(hidden, inter)),
                     ln1=torch.rand(hidden, generator=g) + 0.5, ln2=torch.rand(hidden, generator=g) + 0.5,
                     qk_norm=torch.rand(nq + nkv, hd, generator=g) + 0.5 if qk_norm else None)
    k = torch.randn(1, nkv, cap, hd, generator=g)
    v = torch.randn(1, nkv, cap, hd, generator=g)
    return w, LayerShape(nq, nkv, hd, 1e-6, hd ** -0.5), k, v, g


@pytest.mark.parametrize("nq,nkv,bias,qk_norm", [(4, 2, False, False), (4, 4, True, False), (6, 2, False, True)])
def test_one_row_layer_equals_the_eager_layer(nq, nkv, bias, qk_norm, monkeypatch):
    """Output and the cache entry it writes ≈ layer_step's (fp32, another summation order), at several
    positions (the cache length is a dynamic size: one compilation serves them)."""
    monkeypatch.setattr(R._COMPILED, "failed", None)  # a fallback an earlier test left must not decide this one
    hd, hidden, inter = 8, 32, 48
    w, shape, k0, v0, g = _layer_inputs(nq, nkv, hd, hidden, inter, bias, qk_norm)
    for pos in (1, 5, 17):
        x = torch.randn(1, 1, hidden, generator=g)
        ang = torch.rand(1, 1, 1, hd, generator=g) * 6
        cos, sin = ang.cos(), ang.sin()
        mask = torch.zeros(1, 1, 1, pos + 1)
        mask[..., 0] = float("-inf") if pos > 2 else 0.0  # a hidden position must stay hidden
        idx = torch.full((1, nkv, 1, hd), pos)
        outs, caches = [], []
        for fn in (R.one_row_layer_step, layer_step):
            k, v = k0.clone(), v0.clone()
            with torch.no_grad():
                outs.append(fn(x, cos, sin, mask, k, v, idx, pos + 1, w, shape))
            caches.append((k, v))
        assert R._COMPILED.failed is None, R._COMPILED.failed
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        for a, b in zip(caches[0], caches[1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            assert not torch.equal(a[:, :, pos], k0[:, :, pos])  # this step's entry was written
        assert not torch.equal(outs[0], x)


def test_one_row_layer_falls_back_to_the_eager_layer_with_a_warning(monkeypatch):
    def broken():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(R._COMPILED, "compiled", broken)
    monkeypatch.setattr(R._COMPILED, "failed", None)
    nq, nkv, hd, hidden, inter = 4, 2, 8, 32, 48
    w, shape, k, v, g = _layer_inputs(nq, nkv, hd, hidden, inter, False, False)
    x, cos, sin = torch.randn(1, 1, hidden, generator=g), torch.ones(1, 1, 1, hd), torch.zeros(1, 1, 1, hd)
    args = (x, cos, sin, torch.zeros(1, 1, 1, 4), k, v, torch.full((1, nkv, 1, hd), 3), 4, w, shape)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        y = R.one_row_layer_step(*args)
    assert R._COMPILED.failed and torch.equal(y, layer_step(*args))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_target_forward_one_token_step_uses_the_compiled_layer(arch, monkeypatch):
    """Our forward's batch-1 step: logits with the compiled layer ≈ with the eager layer (MKL), same argmax;
    multi-token steps keep layer_step."""
    from engine_helpers import tiny_config, varied_random_target
    from lilicorr.engine import target_forward as TF
    from lilicorr.engine.target_forward import TargetForward

    monkeypatch.setattr(R._COMPILED, "failed", None)  # a fallback an earlier test left must not decide this one
    calls = []
    real = TF.one_row_layer_step
    monkeypatch.setattr(TF, "one_row_layer_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    tf = TargetForward(varied_random_target(tiny_config(arch)))
    assert tf.fast_gemv  # fp32 on CPU: on by default
    prompt = torch.randint(0, tf.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    outs = []
    for fast in (True, False):
        tf.fast_gemv = fast
        cache = tf.new_cache(1, 32)
        tf(prompt, cache, slice(0, 1), kv_len=12)
        cache.lens[0] = 12
        outs.append(tf(torch.tensor([[3]]), cache, slice(0, 1), kv_len=13).logits)
    assert R._COMPILED.failed is None, R._COMPILED.failed
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
    assert len(calls) == tf.num_layers  # the one-token step with fast_gemv only (not prefill, not MKL)
