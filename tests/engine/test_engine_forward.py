"""Our target forward against transformers: logits, captured layers, cache offsets, tree masks."""

import pytest
import torch

from lilicorr.engine.candidates import ancestor_mask, depths
from lilicorr.engine.target_forward import TargetForward
from engine_helpers import tiny_config, varied_random_target


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return varied_random_target(tiny_config(request.param), seed=3)


def test_fp32_logits_and_captured_match_transformers_across_chunks(model):
    tf = TargetForward(model, capture_ids=[0, 2])
    cache = tf.new_cache(max_batch=3, max_len=64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 13), generator=g)
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
    logits, captured = [], []
    for a, b in [(0, 7), (7, 8), (8, 13)]:  # prefill, one AR step, a 5-token block
        out = tf(ids[:, a:b], cache, slice(0, 3), kv_len=b)
        cache.lens[:3] += b - a
        logits.append(out.logits)
        captured.append(out.captured)
    logits, captured = torch.cat(logits, 1), torch.cat(captured, 1)
    assert (logits - ref.logits).abs().max() < 1e-4
    want = torch.cat([ref.hidden_states[1], ref.hidden_states[3]], dim=-1)  # outputs of layers 0 and 2
    assert (captured - want).abs().max() < 1e-4


def test_rows_at_different_lengths_and_slot_offsets(model):
    """Two rows with different cache lengths, living in slots 1-2 of a 4-slot cache."""
    tf = TargetForward(model)
    cache = tf.new_cache(max_batch=4, max_len=32)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, model.config.vocab_size, (1, 9), generator=g)
    b = torch.randint(0, model.config.vocab_size, (1, 4), generator=g)
    tf(a[:, :6], cache, slice(1, 2), kv_len=6)
    tf(b[:, :2], cache, slice(2, 3), kv_len=2)
    cache.lens[1], cache.lens[2] = 6, 2
    step = torch.cat([a[:, 6:8], b[:, 2:4]])  # (2, 2): both rows advance by two at their own offsets
    out = tf(step, cache, slice(1, 3), kv_len=8, logits_at=torch.tensor([[1], [1]]))
    with torch.no_grad():
        ra = model(a[:, :8]).logits[0, -1]
        rb = model(b[:, :4]).logits[0, -1]
    assert (out.logits[0, 0] - ra).abs().max() < 1e-4
    assert (out.logits[1, 0] - rb).abs().max() < 1e-4


def test_tree_nodes_see_only_their_ancestors_and_compaction(model):
    """A tree's node logits equal those of its root-to-node chain; the accepted path's KV compacts."""
    tf = TargetForward(model)
    cache = tf.new_cache(max_batch=1, max_len=32)
    V = model.config.vocab_size
    prompt = torch.tensor([[5, 17, 42, 8]])
    tf(prompt, cache, slice(0, 1), kv_len=4)
    cache.lens[0] = 4
    tokens = torch.tensor([[11, 20, 21, 30, 31]])  # root 11 -> {20, 21}; 20 -> 30; 21 -> 31
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    out = tf(tokens, cache, slice(0, 1), kv_len=9, node_depth=depths(parents), tree_mask=ancestor_mask(parents))
    paths = {0: [11], 1: [11, 20], 2: [11, 21], 3: [11, 20, 30], 4: [11, 21, 31]}
    with torch.no_grad():
        for node, path in paths.items():
            ref = model(torch.cat([prompt, torch.tensor([path])], 1)).logits[0, -1]
            assert (out.logits[0, node] - ref).abs().max() < 1e-4, node
    # Accept path root -> 21 -> 31 (nodes 0, 2, 4) and continue from there.
    cache.compact(slice(0, 1), cache.lens[:1], torch.tensor([[0, 2, 4]]))
    cache.lens[0] = 7
    nxt = tf(torch.tensor([[7]]), cache, slice(0, 1), kv_len=8)
    with torch.no_grad():
        ref = model(torch.tensor([[5, 17, 42, 8, 11, 21, 31, 7]])).logits[0, -1]
    assert (nxt.logits[0, 0] - ref).abs().max() < 1e-4
    assert V > 31


def test_bf16_argmax_agrees_with_transformers():
    """Against HF's eager attention (same op order as ours). A random model's logits are full of
    near-ties, so HF's own SDPA and eager paths disagree on ~1% of argmaxes here; the SmolLM2 test
    (slow) checks agreement with the default path on real text."""
    cfg = tiny_config("qwen3", overrides=["target.dtype=bfloat16"])
    model = varied_random_target(cfg, seed=4).to(torch.bfloat16)
    model.config._attn_implementation = "eager"
    tf = TargetForward(model)
    cache = tf.new_cache(max_batch=1, max_len=600)
    ids = torch.randint(0, cfg.target.vocab_size, (1, 512), generator=torch.Generator().manual_seed(2))
    out = tf(ids, cache, slice(0, 1), kv_len=512)
    with torch.no_grad():
        ref = model(ids).logits
    agree = (out.logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.999, agree


def test_fused_projections_are_views_of_the_hf_weights_not_copies(model, monkeypatch):
    """q/k/v and gate/up are re-packed once; the HF Linears then point into the fused buffers, which a second
    forward finds there (nothing is cached on the model)."""
    from lilicorr.kernels import packed_linear

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 0)  # these tiny weights would stay on MKL
    before = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(ids).logits
    tf = TargetForward(model)
    tf2 = TargetForward(model)  # a second forward on the same model reuses the buffers
    for hf_layer, ours, again in zip(model.model.layers, tf.layers, tf2.layers):
        a = hf_layer.self_attn
        assert a.q_proj.weight.data_ptr() == ours.qkv.weight.data_ptr()
        assert a.k_proj.weight.data_ptr() == ours.qkv.weight[a.q_proj.weight.shape[0]:].data_ptr()
        assert hf_layer.mlp.gate_proj.weight.data_ptr() == ours.gate_up.weight.data_ptr()
        for x, y in ((again.qkv.weight, ours.qkv.weight), (again.gate_up.weight, ours.gate_up.weight)):
            assert x.data_ptr() == y.data_ptr() and x.shape == y.shape  # the same buffer, found, not re-packed
        # fp32 CPU: one oneDNN-packed copy per weight, shared by both forwards (not one per system)
        assert ours.qkv.packed is not None and again.qkv.packed is ours.qkv.packed
        assert again.o.packed is ours.o.packed and again.down.packed is ours.down.packed
    assert sum(p.numel() for p in model.parameters()) == before
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)  # the HF model computes exactly as before


def test_attention_slices_long_queries_within_the_score_budget(monkeypatch):
    """Per-row lengths + GQA: SDPA and the eager path equal a repeat_interleave reference, and a long span
    is cut into query slices whose (C, nq, T, S) size stays within the budget."""
    from lilicorr.engine import attention

    g = torch.Generator().manual_seed(0)
    c, nq, nkv, t, s, hd = 2, 6, 2, 40, 64, 8
    q, k, v = (torch.randn(c, n, m, hd, generator=g) for n, m in ((nq, t), (nkv, s), (nkv, s)))
    lens = torch.tensor([24, 10])  # row 1 attends over fewer cached positions
    mask = attention.step_mask(lens, s, t, None)
    scores = q @ k.repeat_interleave(nq // nkv, 1).transpose(-1, -2) * 0.3
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v.repeat_interleave(nq // nkv, 1)
    seen = []
    real = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda q_, *a, **kw: seen.append(q_.shape) or real(q_, *a, **kw))
    budget = c * nq * s * 7  # 7 query rows per slice
    add = attention.additive(mask, q.dtype)
    for eager in (False, True):
        out = attention.attend(q, k, v, add, 0.3, eager=eager, budget=budget)
        assert (out - ref).abs().max() < 1e-5
    assert len(seen) == -(-t // 7) and all(sh[2] <= 7 for sh in seen)
