"""The target's whole layer stack as ONE TorchScript call, for every fp32 CPU step.

Why: a multi-token step (verification of a block, batched decoding, prefill) runs ~30 small eager ops per
layer besides its four GEMMs (norms, RoPE, the cache writes, attention, residuals), 900 over SmolLM2's 30
layers, and on a 2-core CPU each pays Python's dispatch, a sizeable share of an 8-token verification pass. The
TorchScript interpreter runs the same ops without it, and the pass is faster side by side (`python jobs/bench.py
engine` reports forward costs with and without, engine.cpu_script_layers; the figures: docs/results.md, "CPU fast
paths" and "One path per computation"). torch.compile was measured slower for these steps: its guard checks and
calls cost more than the ops it fuses here.

The body is layer.layer_step's, line for line, over plain tensors (the layer records' fields, flattened into
lists); attention_heads, rms_norm, attention.attend and packed_linear.linear_on are the eager path's own
functions, scripted. Same ops in the same order: the outputs are bit-identical to the eager stack's
(tests/parity/test_parity_target_layers.py). If TorchScript cannot script here, the call warns once and the eager
layers run instead (kernels/scripted.py, which also says why TorchScript, deprecated since torch 2.13, is used).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch.nn.functional as F
from torch import Tensor

from lilicorr.kernels.packed_linear import linear_on
from lilicorr.kernels.scripted import Scripted

from .layer import LayerShape, LayerWeights, attention_heads, rms_norm


def _layer_stack(x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, k_bufs: List[Tensor], v_bufs: List[Tensor],
                 write_idx: Tensor, kv_len: int, weights: List[Tensor], packed: List[Optional[Tensor]],
                 biases: List[Optional[Tensor]], norms: List[Tensor], qk_norms: List[Optional[Tensor]], nq: int,
                 nkv: int, hd: int, eps: float, scale: float, capture_ids: List[int]) -> Tuple[Tensor, Dict[int, Tensor]]:
    """layer_step over every layer; per layer i: weights / packed [4i:4i+4] = qkv, o, gate_up, down;
    biases [2i:2i+2] = qkv, o; norms [2i:2i+2] = ln1, ln2. Returns x (C, T, H) and {captured layer: its output}."""
    captured: Dict[int, Tensor] = {}
    for i in range(len(k_bufs)):
        h = rms_norm(x, norms[2 * i], eps)
        qkv = linear_on(h, weights[4 * i], packed[4 * i], biases[2 * i])
        a = attention_heads(qkv, cos, sin, mask, k_bufs[i], v_bufs[i], write_idx, kv_len, qk_norms[i], nq, nkv, hd,
                            eps, scale, False)
        x = x + linear_on(a, weights[4 * i + 1], packed[4 * i + 1], biases[2 * i + 1])
        gu = linear_on(rms_norm(x, norms[2 * i + 1], eps), weights[4 * i + 2], packed[4 * i + 2], None)
        inter = gu.shape[-1] // 2
        x = x + linear_on(F.silu(gu[..., :inter]) * gu[..., inter:], weights[4 * i + 3], packed[4 * i + 3], None)
        if i in capture_ids:
            captured[i] = x
    return x, captured


_SCRIPT = Scripted("scripted layer stack", "the eager layers", stack=_layer_stack)


def available() -> bool:
    """Whether the scripted stack can run in this process (scripts it on the first call)."""
    return _SCRIPT.get() is not None


def scripted_layers(x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, k_bufs: List[Tensor], v_bufs: List[Tensor],
                    write_idx: Tensor, kv_len: int, layers: List[LayerWeights], s: LayerShape,
                    capture_ids: List[int]) -> Tuple[Tensor, Dict[int, Tensor]]:
    """Every layer of `layers` on x (C, T, H) (the arguments of layer_step, cache views per layer), one call.
    Packed copies are read per call, where the eager path would take them (Projection.packed_for: 2+ rows): a
    re-packed weight (changed in place) is picked up as there."""
    rows = x.shape[0] * x.shape[1]
    weights: List[Tensor] = []
    packed: List[Optional[Tensor]] = []
    biases: List[Optional[Tensor]] = []
    norms: List[Tensor] = []
    qk_norms: List[Optional[Tensor]] = []
    for w in layers:
        for p in (w.qkv, w.o, w.gate_up, w.down):
            weights.append(p.weight)
            packed.append(p.packed_for(rows))
        biases += [w.qkv.bias, w.o.bias]
        norms += [w.ln1, w.ln2]
        qk_norms.append(w.qk_norm)
    return _SCRIPT.get()["stack"](x, cos, sin, mask, k_bufs, v_bufs, write_idx, kv_len, weights, packed, biases, norms, qk_norms,
                     s.nq, s.nkv, s.hd, float(s.eps), float(s.scale), capture_ids)
