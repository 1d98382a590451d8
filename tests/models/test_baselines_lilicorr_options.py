"""LiLiCorr's open choices as HeadConfig options (issue 16): ours vs NVIDIA Model-Optimizer's plugin."""

import dataclasses

import pytest
import torch

from lilicorr.config import HeadConfig, load_config
from lilicorr.models import losses
from lilicorr.models.heads import LiLiCorrHead
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE_8B = 36_762_080  # Table 4: 36.76M at the qwen3-8b sizes, with every choice set to ours
OURS = {"lilicorr_embed": "rms", "lilicorr_feature_norm": "none", "lilicorr_init": "torch", "lilicorr_target": "mean",
        "lilicorr_partial": "cut", "lilicorr_slot_bias": "per_layer", "lilicorr_norm_eps": "fixed"}


@pytest.mark.parametrize("field,value,delta", [
    ("lilicorr_embed", "raw", 0),
    ("lilicorr_feature_norm", "layernorm", 10),  # LayerNorm(5): weight + bias
    ("lilicorr_init", "normal", 0),
    ("lilicorr_target", "fused", -4096 + 1024),  # RMSNorm(H) over the mean -> RMSNorm(W) after the Linear
    ("lilicorr_partial", "drop", 0),
    ("lilicorr_slot_bias", "shared", -(8 * (2 * 15 - 1) + 8)),  # one layer's slot-distance and same-slot tables
    ("lilicorr_norm_eps", "drafter", 0),
])
def test_param_count_of_each_choice_at_qwen3_8b(field, value, delta):
    cfg = load_config("qwen3-8b")
    with torch.device("meta"):
        ours = dataclasses.replace(cfg.head, **OURS)
        base = LiLiCorrHead(ours, cfg.loss, 4096, 4096, 5, 16)
        other = LiLiCorrHead(dataclasses.replace(ours, **{field: value}), cfg.loss, 4096, 4096, 5, 16)
    n = lambda h: sum(p.numel() for p in h.parameters())  # noqa: E731
    assert n(base) == BASE_8B and n(other) == BASE_8B + delta
    assert round(n(other) / 1e6, 2) == 36.76  # still the paper's figure to two decimals


def test_unknown_choice_names_the_field():
    cfg = load_config("tiny-random")
    with pytest.raises(ValueError, match="lilicorr_target"):
        LiLiCorrHead(dataclasses.replace(cfg.head, lilicorr_target="both"), cfg.loss, 64, 64, 2, 4)


def joint(*extra):
    cfg = load_config("tiny-random", ["head.kind=lilicorr", "target.vocab_size=512", *extra])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target))


def head_ce_grads(m):
    """Gradients of the head's CE with the drafter's slot outputs detached: only the target-state path is left."""
    ids = torch.randint(0, m.cfg.target.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    out = m.build_batch(ids, torch.ones_like(ids, dtype=torch.bool), torch.Generator().manual_seed(0))
    b = out[0] if isinstance(out, tuple) else out
    b.slot_logits, b.slot_hidden = b.slot_logits.detach(), b.slot_hidden.detach()
    b.labels, b.valid = b.slot_logits.argmax(-1), torch.ones_like(b.valid)  # full oracle prefix
    cand, g_idx, prefix, z = m.head._teacher_forced(b)
    losses.lilicorr_ce(z, g_idx, prefix).backward()
    return m.drafter.fc.weight.grad


def test_fused_target_state_trains_the_drafters_fusion_layer():
    assert head_ce_grads(joint("head.lilicorr_target=mean")) is None  # the head reads the captured layers itself
    grad = head_ce_grads(joint("head.lilicorr_target=fused"))
    assert grad is not None and grad.abs().sum() > 0
    m = joint("head.lilicorr_target=fused")
    state = torch.randn(3, m.head.num_captured * m.target.hidden_size)
    with torch.no_grad():
        want = m.head.target_norm(m.head.target_proj(m.drafter.hidden_norm(m.drafter.fc(state))))
        assert torch.allclose(m.head.target_projection(state), want, atol=1e-6)
    assert "fc.weight" not in dict(m.head.named_parameters())  # the drafter's weights stay the drafter's


def embed_proj_input(m):
    seen = {}
    m.head.embed_proj.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0]))
    cand = torch.tensor([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]])
    with torch.no_grad():
        m.head.vectors(cand, torch.zeros(1, 3, 3, 5), torch.zeros(1, 3, m.drafter.hidden_size),
                       torch.zeros(1, m.head.num_captured * m.target.hidden_size))
    return cand, seen["x"]


def test_candidate_embedding_rms_or_raw():
    m = joint("head.lilicorr_embed=rms")
    cand, x = embed_proj_input(m)
    raw = m.target.embed(cand)
    assert torch.allclose(x, raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6))  # unit RMS (eps aside)
    assert raw.pow(2).mean() < 0.01  # the frozen rows themselves are tiny (N(0, 0.02) init)
    m = joint("head.lilicorr_embed=raw")
    cand, x = embed_proj_input(m)
    assert torch.equal(x, m.target.embed(cand))


def test_feature_layernorm_makes_the_confidence_mlp_scale_free():
    m = joint("head.lilicorr_feature_norm=layernorm")
    assert isinstance(m.head.feature_norm, torch.nn.LayerNorm)
    f = torch.randn(4, 5)
    mlp = lambda x: m.head.conf_mlp(m.head.feature_norm(x))  # noqa: E731
    with torch.no_grad():
        assert torch.allclose(mlp(f), mlp(10.0 * f + 3.0), atol=1e-4)
    assert isinstance(joint("head.lilicorr_feature_norm=none").head.feature_norm, torch.nn.Identity)


def test_normal_init_of_every_head_linear():
    head = LiLiCorrHead(dataclasses.replace(HeadConfig(), lilicorr_init="normal", num_layers=1), load_config(
        "tiny-random").loss, 512, 512, 2, 8)
    for name, mod in head.named_modules():
        if isinstance(mod, torch.nn.Linear):
            assert 0.018 < mod.weight.std() < 0.022 and mod.bias.abs().sum() == 0, name
    torch_init = LiLiCorrHead(dataclasses.replace(HeadConfig(), lilicorr_init="torch", num_layers=1), load_config("tiny-random").loss,
                              512, 512, 2, 8)
    assert torch_init.fuse.bias.abs().sum() > 0  # PyTorch's default: uniform(+-1/sqrt(fan_in)) biases


def test_partly_masked_blocks_cut_or_dropped():
    cand = torch.tensor([[[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 4], [5, 6]]])
    labels = torch.tensor([[2, 3, 6], [1, 4, 5]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    _, cut = losses.oracle_prefix(cand, labels, valid)
    _, drop = losses.oracle_prefix(cand, labels, valid, drop_partial=True)
    assert cut.tolist() == [[True, True, False], [True, True, True]]
    assert drop.tolist() == [[False, False, False], [True, True, True]]


def test_exports_made_before_the_options_load_with_the_choices_they_were_built_with(tmp_path):
    """The defaults moved to Model-Optimizer's; an export whose config predates the options was built with
    ours and must still load (the fused target state has other parameters than the mean one)."""
    import json

    cfg = load_config("tiny-random", ["head.kind=lilicorr", *[f"head.{k}={v}" for k, v in OURS.items()]])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target))
    m.export(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    for k in OURS:
        del meta["config"]["head"][k]
    (tmp_path / "config.json").write_text(json.dumps(meta))
    loaded = JointModel.load_exported(tmp_path, m.target.hf)
    assert {k: getattr(loaded.cfg.head, k) for k in OURS} == OURS
    assert HeadConfig().lilicorr_target != OURS["lilicorr_target"]  # else this test would prove nothing
