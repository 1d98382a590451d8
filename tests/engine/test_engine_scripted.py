"""The scripted layer stack (engine/scripted_stack.py) against the eager layers it replaces: bit-identical
logits, captured states and cache writes on every kind of step that takes it."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine import scripted_stack as S
from lilicorr.engine.candidates import ancestor_mask, depths
from lilicorr.engine.target_forward import TargetForward
from lilicorr.kernels import packed_linear
from lilicorr.kernels.scripted import Scripted


def _model(arch: str):
    if arch != "llama-bias":
        return varied_random_target(tiny_config(arch))
    # q/k/v and o biases (attention_bias): the bias path of the fused qkv projection
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _steps(vocab: int):
    """(tokens, rows, node_depth, tree_mask) of a prefill, a chain block, a tree block, a batched one-token step
    and one row's one token, on a cache whose two rows hold 9 and 6 tokens after the prefill."""
    g = torch.Generator().manual_seed(3)
    tok = lambda c, t: torch.randint(0, vocab, (c, t), generator=g)  # noqa: E731
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 0]])
    return [("prefill", tok(2, 9), None, None), ("chain", tok(2, 6), None, None),
            ("tree", tok(2, 5), depths(parents), ancestor_mask(parents)), ("batched", tok(2, 1), None, None),
            ("one", tok(1, 1), None, None)]


@pytest.mark.parametrize("prepack", [True, False])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama-bias"])
def test_scripted_stack_equals_the_eager_layers(arch, prepack, monkeypatch):
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)  # the tiny weights pack too (prepack=True)
    calls = []
    real = S.scripted_layers
    monkeypatch.setattr(S, "scripted_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _model(arch)
    n = model.config.num_hidden_layers
    tf = TargetForward(model, capture_ids=[0, n - 1, n - 1], prepack=prepack)  # an id twice: repeated output
    assert tf.script_layers and S.available()
    assert all((p.packed is not None) == prepack for w in tf.layers for p in (w.qkv, w.o, w.gate_up, w.down))
    eager_cache = tf.new_cache(2, 40)
    caches = {False: eager_cache, True: copy.deepcopy(eager_cache)}
    for name, tokens, node_depth, tree_mask in _steps(tf.vocab_size):
        c = tokens.shape[0]
        rows = slice(0, c)
        outs = {}
        for scripted in (False, True):
            cache = caches[scripted]
            if name == "chain":  # rows of different lengths
                cache.lens[:2] = torch.tensor([9, 6])
            kv_len = int(cache.lens[rows].max()) + tokens.shape[1]
            tf.script_layers = scripted
            outs[scripted] = tf(tokens, cache, rows, kv_len, node_depth=node_depth, tree_mask=tree_mask)
            if name == "prefill":
                cache.lens[:2] = torch.tensor([9, 9])
            else:
                cache.lens[rows] += tokens.shape[1]
        a, b = outs[False], outs[True]
        assert torch.equal(a.logits, b.logits), name
        assert torch.equal(a.captured, b.captured), name
        for ka, kb in zip(caches[False].k + caches[False].v, caches[True].k + caches[True].v):
            assert torch.equal(ka, kb), name
    assert len(calls) == len(_steps(tf.vocab_size))  # every step took the scripted stack when asked
    assert caches[True].k[0].abs().sum() > 0  # the steps wrote the cache


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
    tf = TargetForward(varied_random_target(tiny_config("llama")))
    ref = TargetForward(varied_random_target(tiny_config("llama")))
    ref.script_layers = False
    tokens = torch.tensor([[1, 2, 3, 4]])
    with pytest.warns(RuntimeWarning, match="no TorchScript here"):
        got = tf(tokens, tf.new_cache(1, 16), slice(0, 1), 4)
    assert S._SCRIPT.failed and not S.available()
    assert torch.equal(got.logits, ref(tokens, ref.new_cache(1, 16), slice(0, 1), 4).logits)
