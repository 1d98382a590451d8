"""Parity of the target's layer stack on one step (engine/target_forward.py): every kind of step the engine takes (a
prefill, a chain block at rows of different lengths, a tree block, a batched one-token step, one row's one token),
its logits, the captured layers' outputs and the K/V it writes into the cache.

Reference: the eager layers (engine/layer.py `layer_step`, TargetForward(script_layers=False)) over F.linear
(prepack=False); their own check against transformers: tests/engine/test_engine_forward.py.
Fast paths (engine/backend.py: `target_steps`, `target_one_row`, `linear`, `lm_head`), chosen through
TargetForward's arguments as systems.py does:
  scripted-stack   engine/scripted_stack.py: every layer in one TorchScript call (engine.cpu_script_layers), the
                   eager layers' ops in the same order: bit-identical over the same projections
  onednn-packed    the projections and the LM head at 2+ rows on oneDNN-packed weights (engine.cpu_prepack); at one
                   row F.linear ("packed"), or the packed weights too ("packed-1row": engine.cpu_one_row).
                   The kernel's own parity: test_parity_linear.py
fp32 CPU only: a bf16 target keeps the eager layers in transformers' op order (checked below).
Shapes: tiny Llama and Qwen3 targets (hidden 64: below MIN_ELEMENTS, so nothing packs at that size) and SmolLM2-135M's
layer shape (hidden 576, 9 / 3 heads of 64, FFN 1536), as Llama, Qwen3 (q/k norms) and Llama with q/k/v/o biases.
"""

import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine import scripted_stack as S
from lilicorr.engine.candidates import ancestor_mask, depths
from lilicorr.engine.target_forward import TargetForward
from lilicorr.kernels.scripted import Scripted

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMOLLM2_LAYER = ["target.hidden_size=576", "target.num_heads=9", "target.num_kv_heads=3", "target.head_dim=64",
                 "target.intermediate_size=1536", "target.num_layers=2"]
SHAPES = ["llama-64", "qwen3-64", "llama-576", "qwen3-576", "llama-bias-576"]
# (layer stack, projections) of each backend; the reference is ("eager", "torch")
BACKENDS = [("scripted", "torch", shape) for shape in SHAPES]
BACKENDS += [(stack, projections, shape) for projections in ("packed", "packed-1row") for stack in ("eager", "scripted")
             for shape in SHAPES if shape.endswith("576")]
# Tolerance against the reference: exact over F.linear (the same ops in the same order). Over packed weights, oneDNN
# sums each projection's products in another order (~1e-6 relative), compounded over the layers and the LM head:
# 1e-4, the bound our forward meets against transformers' own (test_engine_forward.py).
PACKED_TOL = dict(rtol=1e-4, atol=1e-4)


@functools.lru_cache(maxsize=None)
def _model(shape: str):
    arch, hidden = shape.rsplit("-", 1)
    if arch != "llama-bias":
        return varied_random_target(tiny_config(arch, overrides=SMOLLM2_LAYER if hidden == "576" else []))
    # q/k/v and o biases (attention_bias): the bias path of the fused qkv projection
    cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3, attention_bias=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # varied_random_target's scales, and biases that are not zero
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p.shape[1] ** 0.5 if p.dim() == 2 else 10))
        model.model.embed_tokens.weight.copy_(torch.randn(model.model.embed_tokens.weight.shape, generator=g))
    return model


def _steps(vocab: int):
    """(name, tokens, node_depth, tree_mask) of a prefill, a chain block, a tree block, a batched one-token step
    and one row's one token, on a cache whose two rows hold 9 and 6 tokens after the prefill."""
    g = torch.Generator().manual_seed(3)
    tok = lambda c, t: torch.randint(0, vocab, (c, t), generator=g)  # noqa: E731
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 0]])
    return [("prefill", tok(2, 9), None, None), ("chain", tok(2, 6), None, None),
            ("tree", tok(2, 5), depths(parents), ancestor_mask(parents)), ("batched", tok(2, 1), None, None),
            ("one", tok(1, 1), None, None)]


def _run(tf: TargetForward):
    """Every step of _steps on a fresh cache: per step (name, logits, captured, the cache's K/V after it)."""
    cache = tf.new_cache(2, 40)
    out = []
    for name, tokens, node_depth, tree_mask in _steps(tf.vocab_size):
        rows = slice(0, tokens.shape[0])
        if name == "chain":  # rows of different lengths
            cache.lens[:2] = torch.tensor([9, 6])
        kv_len = int(cache.lens[rows].max()) + tokens.shape[1]
        step = tf(tokens, cache, rows, kv_len, node_depth=node_depth, tree_mask=tree_mask)
        if name == "prefill":
            cache.lens[:2] = torch.tensor([9, 9])
        else:
            cache.lens[rows] += tokens.shape[1]
        out.append((name, step.logits, step.captured, [b.clone() for b in cache.k + cache.v]))
    assert cache.k[0].abs().sum() > 0  # the steps wrote the cache
    return out


def _forward(shape: str, stack: str, projections: str) -> TargetForward:
    n = _model(shape).config.num_hidden_layers
    # an id listed twice: a repeated output, as tiny targets capture
    return TargetForward(_model(shape), capture_ids=[0, n - 1, n - 1], prepack=projections.startswith("packed"),
                         script_layers=stack == "scripted", one_row_packed=projections == "packed-1row")


def _compare(got, ref, tol=None):
    for (name, *a), (_, *b) in zip(got, ref):
        for x, y in zip(a[:2] + a[2], b[:2] + b[2]):  # logits, captured, then every K and V buffer
            if tol is None:
                assert torch.equal(x, y), name
            else:
                torch.testing.assert_close(x, y, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("stack,projections,shape", BACKENDS)
def test_backend_steps_equal_the_eager_layers(stack, projections, shape, monkeypatch):
    calls = []
    real = S.scripted_layers  # a spy: it counts the scripted stack's calls and forces nothing
    monkeypatch.setattr(S, "scripted_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    tf = _forward(shape, stack, projections)
    projs = [p for w in tf.layers for p in (w.qkv, w.o, w.gate_up, w.down)]
    packed = [p.packed is not None for p in projs]
    assert all(packed) if projections.startswith("packed") else not any(packed)
    one_row = [p.packed_for(1) is not None for p in projs + [tf.lm_head_proj]]
    assert all(one_row) if projections == "packed-1row" else not any(one_row)
    got = _run(tf)
    assert len(calls) == (len(got) if stack == "scripted" else 0)  # every step took the stack asked for
    calls.clear()
    reference = _run(_forward(shape, "eager", "torch"))
    if projections == "torch":
        _compare(got, reference)
        return
    _compare(got, reference, PACKED_TOL)
    if stack == "scripted":  # over the same packed projections, the eager layers' bits
        _compare(got, _run(_forward(shape, "eager", projections)))


def test_scripted_stack_is_not_used_for_bf16(monkeypatch):
    """bf16 on CPU keeps transformers' eager attention (the reference for bf16 checks): not scripted."""
    calls = []
    real = S.scripted_layers
    monkeypatch.setattr(S, "scripted_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    tf = TargetForward(varied_random_target(tiny_config("llama")).to(torch.bfloat16))
    assert not tf.script_layers
    cache = tf.new_cache(1, 16)
    tf(torch.tensor([[1, 2, 3]]), cache, slice(0, 1), 3)
    assert calls == []


def test_scripted_stack_falls_back_to_the_eager_layers_with_a_warning(monkeypatch):
    def broken(fn):
        raise RuntimeError("no TorchScript here")

    monkeypatch.setattr(S, "_SCRIPT", Scripted("scripted layer stack", "the eager layers", stack=S._layer_stack))
    monkeypatch.setattr(torch.jit, "script", broken)
    tf = TargetForward(_model("llama-64"))
    ref = TargetForward(_model("llama-64"), script_layers=False)
    tokens = torch.tensor([[1, 2, 3, 4]])
    with pytest.warns(RuntimeWarning, match="no TorchScript here"):
        got = tf(tokens, tf.new_cache(1, 16), slice(0, 1), 4)
    assert S._SCRIPT.failed and not S.available()
    assert torch.equal(got.logits, ref(tokens, ref.new_cache(1, 16), slice(0, 1), 4).logits)
