"""Domino and DSpark as SpecForge trains them (issue 16): each rule against a hand-computed case.

References: sgl-project/SpecForge specforge/modeling/draft/{domino,dspark}.py and
specforge/algorithms/common/dflash_family_model.py (OnlineDominoModel, OnlineDSparkModel).
"""

import math

import pytest
import torch

from lilicorr.config import DrafterConfig, HeadConfig
from lilicorr.models.heads import DominoHead, DSparkHead
from lilicorr.models.heads.base import HeadBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class TableTarget:
    """A stand-in frozen target: embed(ids) = rows of a fixed table."""

    def __init__(self, table):
        self.table = table

    def embed(self, ids):
        return self.table[ids]


def gru_step(gru, x, h):
    """One bias-free GRU step written out (PyTorch's gate order r, z, n)."""
    w_ir, w_iz, w_in = gru.weight_ih_l0.chunk(3)
    w_hr, w_hz, w_hn = gru.weight_hh_l0.chunk(3)
    r = torch.sigmoid(x @ w_ir.T + h @ w_hr.T)
    z = torch.sigmoid(x @ w_iz.T + h @ w_hz.T)
    n = torch.tanh(x @ w_in.T + r * (h @ w_hn.T))
    return (1 - z) * n + z * h


def domino(V=7, H=4, G=3, M=5):
    torch.manual_seed(0)
    head = DominoHead(HeadConfig(domino_gru_hidden=G, domino_mlp_hidden=M), DrafterConfig(loss_decay_beta=7.0),
                      H, H, V)
    head.attach_target(TableTarget(torch.randn(V, H)))
    return head


def test_domino_gru_reads_the_anchor_first():
    head = domino()
    V, H = 7, 4
    slot_logits, slot_hidden = torch.randn(1, 3, V), torch.randn(1, 3, H)
    anchor, t1, t2 = 5, 2, 6
    with torch.no_grad():
        got = head.corrected_logits(slot_logits, slot_hidden, torch.tensor([anchor]), torch.tensor([[t1, t2]]))
        E = head._target.table
        h = gru_step(head.gru, E[anchor], torch.zeros(3))  # after [anchor]
        g2 = gru_step(head.gru, E[t1], h)  # slot 2 sees [anchor, t1]: two tokens
        g3 = gru_step(head.gru, E[t2], g2)  # slot 3 sees [anchor, t1, t2]
        mlp = lambda hid, g: head.residual[2].weight @ torch.nn.functional.silu(  # noqa: E731
            head.residual[0].weight @ torch.cat([hid, g]))
    assert torch.equal(got[0, 0], slot_logits[0, 0])  # slot 1 uncorrected
    assert torch.allclose(got[0, 1], slot_logits[0, 1] + mlp(slot_hidden[0, 1], g2), atol=1e-6)
    assert torch.allclose(got[0, 2], slot_logits[0, 2] + mlp(slot_hidden[0, 2], g3), atol=1e-6)
    with torch.no_grad():  # another anchor changes slot 2 already (the old rule read t1 only there)
        other = head.corrected_logits(slot_logits, slot_hidden, torch.tensor([1]), torch.tensor([[t1, t2]]))
    assert not torch.allclose(other[0, 1], got[0, 1])


def test_domino_propose_reads_the_anchor_too():
    head = domino()
    torch.nn.init.normal_(head.residual[2].weight, std=1.0)
    g = torch.Generator().manual_seed(1)
    slot_logits, slot_hidden = torch.randn(6, 3, 7, generator=g), torch.randn(6, 3, 4, generator=g)
    anchors = torch.arange(6)
    with torch.no_grad():
        prop = head.propose(slot_logits, slot_hidden, None, anchors)
        tf = head.corrected_logits(slot_logits, slot_hidden, anchors, prop.tokens[:, :-1])
    assert torch.equal(tf.argmax(-1), prop.tokens)  # sequential pass == teacher-forced on its own drafts


def test_domino_mlp_is_bias_free_and_starts_normal_not_zero():
    head = DominoHead(HeadConfig(domino_gru_hidden=64, domino_mlp_hidden=256), DrafterConfig(), 512, 512, 4096)
    assert head.residual[0].bias is None and head.residual[2].bias is None
    assert all("bias" not in name for name, _ in head.gru.named_parameters())
    for layer in (head.residual[0], head.residual[2]):
        assert layer.weight.mean().abs() < 1e-3 and 0.019 < layer.weight.std() < 0.021


def dspark(V=2, H=2, r=2):
    head = DSparkHead(HeadConfig(dspark_rank=r), H, V)
    with torch.no_grad():  # no Markov bias, confidence logit 0: the terms below are hand-computable
        head.w2.weight.zero_()
        head.confidence.weight.zero_()
        head.confidence.bias.zero_()
    return head


def test_dspark_loss_is_01_ce_plus_09_l1_plus_bce_over_the_cumprod_mask():
    head = dspark()
    # Slot 1: p_draft = (3/4, 1/4), p_target = (1/2, 1/2), label 0. Slot 2 is unsupervised, so slot 3
    # (p_draft = (1/5, 4/5), p_target = (1, 0)) is cut by the cumulative-product mask although valid there.
    slot_logits = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0], [0.0, math.log(4.0)]]])
    target_logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [0.0, -1e4]]])
    batch = HeadBatch(slot_logits=slot_logits, slot_hidden=torch.zeros(1, 3, 2), labels=torch.tensor([[0, 1, 0]]),
                      valid=torch.tensor([[True, False, True]]), target_logits=target_logits,
                      target_state=torch.zeros(1, 2), anchor_ids=torch.tensor([1]))
    out = head.loss(batch)
    ce, l1, bce = -math.log(0.75), 0.5, math.log(2.0)  # BCE of logit 0 against any a is log 2
    assert out.terms["ce"].item() == pytest.approx(ce, rel=1e-5)
    assert out.terms["l1"].item() == pytest.approx(l1, rel=1e-5)  # full L1, not 1/2 L1 (TV)
    assert out.terms["bce"].item() == pytest.approx(bce, rel=1e-5)
    assert out.loss.item() == pytest.approx(0.1 * ce + 0.9 * l1 + bce, rel=1e-5)


def test_dspark_confidence_target_is_clamped_acceptance():
    head = dspark()
    with torch.no_grad():
        head.confidence.bias.fill_(2.0)  # conf = sigmoid(2) everywhere
    slot_logits = torch.tensor([[[0.0, math.log(4.0)]]])  # p_draft = (1/5, 4/5)
    target_logits = torch.tensor([[[0.0, -1e4]]])  # p_target = (1, 0): L1 = 8/5, acceptance 1 - 4/5 = 1/5
    batch = HeadBatch(slot_logits=slot_logits, slot_hidden=torch.zeros(1, 1, 2), labels=torch.tensor([[0]]),
                      valid=torch.tensor([[True]]), target_logits=target_logits, target_state=torch.zeros(1, 2),
                      anchor_ids=torch.tensor([0]))
    out = head.loss(batch)
    s = 1 / (1 + math.exp(-2.0))
    assert out.terms["bce"].item() == pytest.approx(-(0.2 * math.log(s) + 0.8 * math.log(1 - s)), rel=1e-5)
    assert out.terms["l1"].item() == pytest.approx(1.6, rel=1e-5)


def test_dspark_weights_start_normal_like_specforge():
    head = DSparkHead(HeadConfig(dspark_rank=256), 512, 4096)
    for w in (head.w1.weight, head.w2.weight, head.confidence.weight):
        assert w.abs().sum() > 0 and 0.018 < w.std() < 0.022
    assert head.confidence.bias.abs().sum() == 0
