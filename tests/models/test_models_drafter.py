"""DFlash drafter: training mask (no cross-block leak), inference form == training form, init and loading."""

import json

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.models.drafter import DFlashDrafter, training_block_mask
from lilicorr.models.drafter_init import build_drafter, copy_target_top_layers
from lilicorr.models.target import TargetAdapter, build_random_target, capture_layer_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request):
    cfg = load_config("tiny-random", [f"target.arch={request.param}"])
    target = TargetAdapter(build_random_target(cfg.target), capture_layer_ids(cfg.target.num_layers, cfg.drafter.num_layers))
    torch.manual_seed(1)
    drafter = DFlashDrafter(cfg.drafter, target).eval()
    return cfg, target, drafter


def test_capture_layer_ids_follow_dflash_rule():
    assert capture_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert capture_layer_ids(30, 2) == [1, 27]


def test_teacher_forced_pass_captures_layer_outputs(setup):
    cfg, target, _ = setup
    ids = torch.randint(0, cfg.target.vocab_size, (2, 12))
    seen = {}
    hooks = [target.hf.model.layers[i].register_forward_hook(
        lambda m, a, out, i=i: seen.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in set(target.capture_ids)]
    tp = target.teacher_forced(ids)
    for h in hooks:
        h.remove()
    want = torch.cat([seen[i] for i in target.capture_ids], dim=-1)
    assert tp.captured.shape == (2, 12, len(target.capture_ids) * cfg.target.hidden_size)
    assert torch.allclose(tp.captured, want)
    # final_hidden through the LM head is exactly the causal LM's logits (what the feature cache relies on)
    logits = target.lm_head(tp.final_hidden)
    assert torch.allclose(logits, target.hf(input_ids=ids).logits, atol=1e-5)
    assert not tp.final_hidden.requires_grad


def test_mask_blocks_never_see_each_other_or_later_context():
    anchors = torch.tensor([[3, 5, 6]])  # closer together than B = 4
    B, T = 4, 10
    mask = training_block_mask(anchors, B, T)[0]  # (A*B, T + A*B)
    for a, anchor in enumerate(anchors[0].tolist()):
        rows = mask[a * B:(a + 1) * B]
        assert rows[:, :anchor].all() and not rows[:, anchor:T].any()
        blocks = rows[:, T:].view(B, 3, B)
        assert blocks[:, a].all()
        assert not torch.cat([blocks[:, b] for b in range(3) if b != a]).any()


def test_training_form_has_no_leak_behaviourally(setup):
    cfg, target, drafter = setup
    T = 12
    ids = torch.randint(0, cfg.target.vocab_size, (1, T))
    anchors = torch.tensor([[4, 6, 7]])  # overlapping position ranges
    tp = target.teacher_forced(ids)
    emb = drafter.embed_blocks(ids.gather(1, anchors), target.embed)
    with torch.no_grad():
        base = drafter.forward_train(tp.captured, emb, anchors)
        cap2 = tp.captured.clone()
        cap2[:, 4:] += torch.randn_like(cap2[:, 4:])  # context at/after the first anchor
        emb2 = emb.clone()
        emb2[:, 1:] += torch.randn_like(emb2[:, 1:])  # the other blocks' inputs
        moved = drafter.forward_train(cap2, emb2, anchors)
        assert torch.allclose(base[:, 0], moved[:, 0], atol=1e-5)
        assert not torch.allclose(base[:, 1], moved[:, 1], atol=1e-3)  # the perturbation is real


def test_inference_form_matches_training_form(setup):
    cfg, target, drafter = setup
    T = 14
    ids = torch.randint(0, cfg.target.vocab_size, (2, T))
    anchors = torch.tensor([[3, 9], [5, 6]])
    tp = target.teacher_forced(ids)
    with torch.no_grad():
        blocks = drafter.embed_blocks(ids.gather(1, anchors), target.embed)
        train_h = drafter.forward_train(tp.captured, blocks, anchors)
        ctx = drafter.fuse_context(tp.captured)  # the engine fuses as states arrive, caches per layer
        ctx_kv = drafter.project_context(ctx, torch.arange(T).expand(2, T))
        B = drafter.block_size
        for a in range(2):
            anc = anchors[:, a]  # (C,)
            valid = torch.arange(T)[None, :] < anc[:, None]  # the cache holds states before the anchor
            block = drafter.embed_blocks(ids.gather(1, anc[:, None])[:, 0], target.embed)
            pos = anc[:, None] + torch.arange(B)
            h = drafter.forward_block(block, pos, ctx_kv, valid)
            assert torch.allclose(h, train_h[:, a], atol=1e-5)


def test_target_top_init_copies_layers(setup):
    cfg, target, _ = setup
    d = DFlashDrafter(cfg.drafter, target)
    n = copy_target_top_layers(d, target.hf)
    L = target.num_layers
    src = target.hf.model.layers[L - len(d.layers)]
    assert torch.equal(d.layers[0].self_attn.q_proj.weight, src.self_attn.q_proj.weight)
    assert torch.equal(d.layers[-1].mlp.down_proj.weight, target.hf.model.layers[L - 1].mlp.down_proj.weight)
    assert n >= 9 * len(d.layers)


def test_loads_public_dflash_checkpoint_format(setup, tmp_path):
    from safetensors.torch import save_file

    cfg, target, _ = setup
    src = DFlashDrafter(cfg.drafter, target)
    sd = src.state_dict()
    # The z-lab release's key names (Qwen3-8B-DFlash-b16 has the same with 5 layers).
    for key in ["fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.input_layernorm.weight",
                "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.q_proj.weight",
                "layers.0.self_attn.k_norm.weight", "layers.0.self_attn.o_proj.weight",
                "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight"]:
        assert key in sd
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "block_size": cfg.drafter.block_size, "num_hidden_layers": cfg.drafter.num_layers,
        "dflash_config": {"target_layer_ids": target.capture_ids, "mask_token_id": 7}}))
    dcfg = load_config("tiny-random", [f"target.arch={cfg.target.arch}", f"drafter.checkpoint={tmp_path}"]).drafter
    loaded = build_drafter(dcfg, target)
    assert loaded.mask_token_id == 7
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, sd[k]), k
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 99}))
    with pytest.raises(ValueError, match="block size"):
        build_drafter(dcfg, target)
