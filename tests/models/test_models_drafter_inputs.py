"""Issue 11 drafter inputs and losses: learned mask vector, captured-layer count, feature scaling, chunked
LM head + CE, soft labels, and starting a run from another export."""

import torch

from lilicorr.config import load_config
from lilicorr.models.joint import JointModel
from lilicorr.models.losses import dflash_loss, dflash_loss_distilled
from lilicorr.models.target import build_random_target, drafter_capture_ids


def _joint(*overrides):
    cfg = load_config("tiny-random", ["target.vocab_size=512", *overrides])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target))


def _rows(cfg, n=2, T=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.target.vocab_size, (n, T), generator=g)
    mask = torch.zeros(n, T, dtype=torch.bool)
    mask[:, T // 4:] = True
    return ids, mask


def test_learned_mask_vector_feeds_every_mask_slot_and_trains():
    m = _joint("head.kind=none")
    d = m.drafter
    assert d.mask_embedding is not None and d.mask_embedding.requires_grad
    blocks = d.embed_blocks(torch.tensor([[5, 7]]), m.target.embed)  # (1, 2, B, H)
    assert torch.equal(blocks[0, 1, 0], m.target.embed(torch.tensor(7)))
    for s in range(1, d.block_size):
        assert torch.equal(blocks[0, 0, s], d.mask_embedding)
    ids, mask = _rows(m.cfg)
    m(ids, mask, generator=torch.Generator().manual_seed(0), with_metrics=False).loss.backward()
    assert d.mask_embedding.grad is not None and d.mask_embedding.grad.abs().sum() > 0


def test_token_mask_mode_uses_the_mask_tokens_embedding():
    m = _joint("drafter.mask=token", "drafter.mask_token_id=3")
    blocks = m.drafter.embed_blocks(torch.tensor([9]), m.target.embed)
    assert m.drafter.mask_embedding is None
    assert torch.equal(blocks[0, 1], m.target.embed(torch.tensor(3)))


def test_number_of_captured_layers_is_independent_of_drafter_depth():
    cfg = load_config("smollm2-135m", ["drafter.num_layers=2", "drafter.num_captured=5"])

    class C:  # SmolLM2's depth
        num_hidden_layers = 30
    assert drafter_capture_ids(C, cfg.drafter) == [1, 8, 14, 20, 27]
    m = _joint("drafter.num_layers=2", "drafter.num_captured=3", "target.num_layers=8")
    assert len(m.target.capture_ids) == 3 and len(m.drafter.layers) == 2
    assert m.drafter.fc.in_features == 3 * m.target.hidden_size


def test_soft_label_loss_at_distill_0_is_eq_6():
    torch.manual_seed(0)
    logits, labels, valid = torch.randn(5, 3, 40), torch.randint(0, 40, (5, 3)), torch.rand(5, 3) > 0.3
    assert torch.allclose(dflash_loss_distilled(logits, labels, valid, 2.0), dflash_loss(logits, labels, valid, 2.0))


def test_soft_label_term_by_hand():
    # one slot, V = 2: logits (0, 0) -> log p = (-ln2, -ln2); label 0, soft target p_t = (0.25, 0.75)
    logits = torch.zeros(1, 1, 2)
    soft = torch.log(torch.tensor([[[0.25, 0.75]]]))
    got = dflash_loss_distilled(logits, torch.tensor([[0]]), torch.tensor([[True]]), 7.0, soft, distill=0.5)
    ln2 = torch.log(torch.tensor(2.0))
    assert torch.allclose(got, 0.5 * ln2 + 0.5 * ln2)  # both terms are ln 2 at uniform logits
    logits = torch.tensor([[[0.0, torch.log(torch.tensor(3.0))]]])  # p = (0.25, 0.75)
    got = dflash_loss_distilled(logits, torch.tensor([[0]]), torch.tensor([[True]]), 7.0, soft, distill=1.0)
    want = -(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))  # entropy
    assert torch.allclose(got, want, atol=1e-6)


def test_feature_scale_folds_into_fc_at_export(tmp_path):
    m = _joint("drafter.feature_scaling=true", "train.feature_cache=true")
    nH = m.drafter.fc.in_features
    m.drafter.set_feature_scale(torch.linspace(0.5, 40.0, nH))
    x = torch.randn(2, 5, nH)
    before = m.drafter.fuse_context(x)
    m.export(tmp_path / "e")
    again = JointModel.load_exported(tmp_path / "e", m.target.hf)
    assert torch.all(again.drafter.feature_scale == 1)
    assert torch.allclose(again.drafter.fuse_context(x), before, atol=1e-5)


def test_a_run_started_from_a_scaled_export_keeps_its_function(tmp_path):
    """The export folded the scale into fc; a run from it with scaling on must not scale twice."""
    m = _joint("drafter.feature_scaling=true", "train.feature_cache=true", "head.kind=none")
    nH = m.drafter.fc.in_features
    rms = torch.linspace(0.5, 40.0, nH)
    m.drafter.set_feature_scale(rms)
    x = torch.randn(2, 5, nH)
    before = m.drafter.fuse_context(x)
    m.export(tmp_path / "e")
    cont = _joint("drafter.feature_scaling=true", "train.feature_cache=true", "head.kind=none")
    cont.init_from_export(tmp_path / "e")
    cont.drafter.set_feature_scale(rms, keep_function=True)
    assert torch.allclose(cont.drafter.fuse_context(x), before, atol=1e-5)
    twice = _joint("drafter.feature_scaling=true", "train.feature_cache=true", "head.kind=none")
    twice.init_from_export(tmp_path / "e")
    twice.drafter.set_feature_scale(rms)  # the old behaviour: inputs scaled again
    assert not torch.allclose(twice.drafter.fuse_context(x), before, atol=1e-3)


def test_init_from_export_loads_the_drafter_and_a_matching_head(tmp_path):
    src = _joint("head.kind=none")
    with torch.no_grad():
        src.drafter.fc.weight.add_(1.0)
    src.export(tmp_path / "dflash")
    dst = _joint("head.kind=lilicorr")
    assert dst.init_from_export(tmp_path / "dflash") == ["drafter"]  # a DFlash export has no LiLiCorr head
    assert torch.equal(dst.drafter.fc.weight, src.drafter.fc.weight)
    same = _joint("head.kind=none")
    assert same.init_from_export(tmp_path / "dflash") == ["drafter", "head"]


def test_a_deeper_drafter_starts_from_an_export_as_the_identity(tmp_path):
    """drafter.num_layers above the export's: its layers first, each further one drafting as if absent (its o_proj and
    down_proj zero), so the deeper drafter starts with the export's logits; a shallower one is refused."""
    src = _joint("head.kind=none", "drafter.num_layers=1", "drafter.num_captured=2")
    src.export(tmp_path / "e")
    deep = _joint("head.kind=none", "drafter.num_layers=3", "drafter.num_captured=2")
    assert deep.init_from_export(tmp_path / "e") == ["drafter (+2 layers started as the identity)", "head"]
    for i in (1, 2):
        assert not deep.drafter.layers[i].self_attn.o_proj.weight.any()
        assert not deep.drafter.layers[i].mlp.down_proj.weight.any() and deep.drafter.layers[i].mlp.up_proj.weight.any()
    ids, mask = _rows(src.cfg)
    anchors = torch.tensor([[10, 20], [12, 24]])
    with torch.no_grad():
        a = src(ids, mask, anchors=anchors).terms["dflash"]
        b = deep(ids, mask, anchors=anchors).terms["dflash"]
    torch.testing.assert_close(a, b)
    shallow = _joint("head.kind=none", "drafter.num_layers=1", "drafter.num_captured=2")
    deep.export(tmp_path / "deep")
    import pytest

    with pytest.raises(ValueError, match="drafter.num_layers=3 or more"):
        shallow.init_from_export(tmp_path / "deep")


def test_grown_layers_take_their_own_lr_only_when_asked(tmp_path):
    """optim.lr_grown: the layers init_from added (the last ones) form a third AdamW group at that LR; unset, the
    drafter keeps one group, as every run before it."""
    from lilicorr.config import load_config

    src = _joint("head.kind=none", "drafter.num_layers=1", "drafter.num_captured=2")
    src.export(tmp_path / "e")
    deep = _joint("head.kind=none", "drafter.num_layers=3", "drafter.num_captured=2")
    deep.init_from_export(tmp_path / "e")
    assert deep.grown_layers == 2
    optim = load_config("tiny-random", ["optim.lr_drafter=1e-4", "optim.lr_grown=1e-3",
                                        f"train.init_from={tmp_path / 'e'}"]).optim
    groups = {g["name"]: g for g in deep.param_groups(optim)}
    grown = {id(p) for layer in deep.drafter.layers[1:] for p in layer.parameters()}
    assert {id(p) for p in groups["grown"]["params"]} == grown and groups["grown"]["lr"] == 1e-3
    assert not grown & {id(p) for p in groups["drafter"]["params"]} and groups["drafter"]["lr"] == 1e-4
    assert len(groups["drafter"]["params"]) + len(groups["grown"]["params"]) == len(list(deep.drafter.parameters()))
    optim.lr_grown = None
    assert [g["name"] for g in deep.param_groups(optim)] == ["drafter"]
    import pytest

    from lilicorr.config import ConfigError
    with pytest.raises(ConfigError, match="optim.lr_grown=0.001 is the LR of the drafter layers train.init_from adds"):
        load_config("tiny-random", ["optim.lr_grown=1e-3"])
