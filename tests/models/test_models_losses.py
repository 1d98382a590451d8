"""Eq. 1, 2, 3, 4, 6, 7, 8, 12, 13 computed by hand on small tensors (K=3, B=4) against the modules."""

import math

import pytest
import torch

from lilicorr.config import LossConfig
from lilicorr.kernels.lattice import (decode_reference, greedy_walk_reference, lattice_scores_reference,
                                      viterbi_reference)
from lilicorr.models import losses
from lilicorr.models.decode import commit_tokens, path_score

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def unit2(theta):
    return [math.cos(theta), math.sin(theta)]


def test_eq1_cosine_scores_by_hand():
    # C=1, S=3 slots, K=3, d=2; angles give known cosines; magnitudes must not matter.
    out_angles = [[0.0, 0.5, 1.0], [0.2, 1.4, 2.0], [0.3, 0.1, 0.9]]
    in_angles = [[0.1, 0.7, 2.5], [0.4, 1.1, 3.0], [0.0, 1.0, 2.2]]
    scale = [[1.0, 2.0, 0.5], [3.0, 1.0, 1.0], [1.0, 1.0, 4.0]]
    o = torch.tensor([[[[scale[s][k] * x for x in unit2(out_angles[s][k])] for k in range(3)] for s in range(3)]])
    i = torch.tensor([[[unit2(in_angles[s][k]) for k in range(3)] for s in range(3)]])
    a = torch.tensor([[2.0 * math.cos(0.3), 2.0 * math.sin(0.3)]])
    sigma = 8.0
    anchor, pair = lattice_scores_reference(o, i, a, sigma)
    for k in range(3):
        assert anchor[0, k].item() == pytest.approx(sigma * math.cos(in_angles[0][k] - 0.3), abs=1e-5)
    for s in range(2):
        for k in range(3):
            for k2 in range(3):
                want = sigma * math.cos(in_angles[s + 1][k2] - out_angles[s][k])
                assert pair[0, s, k, k2].item() == pytest.approx(want, abs=1e-5)


def small_lattice():
    anchor = torch.tensor([[1.0, 0.5, -1.0]])  # (1, K)
    pair = torch.tensor([[[[0.2, 2.0, 0.1], [1.0, -1.0, 0.0], [0.0, 0.0, 3.0]],
                          [[0.5, 0.4, 0.3], [0.0, 1.5, -2.0], [2.0, 0.1, 0.2]]]])  # (1, S-1=2, K, K)
    return anchor, pair


def test_eq2_eq3_teacher_forced_ce_by_hand():
    anchor, pair = small_lattice()
    g_idx = torch.tensor([[0, 1, 1]])  # ground truth candidate per slot
    prefix = torch.tensor([[True, True, True]])
    z = losses.teacher_forced_scores(anchor, pair, g_idx)
    # Eq. 2: z_1 = anchor scores; z_2 = pair[0, g_1=0, :]; z_3 = pair[1, g_2=1, :]
    assert torch.equal(z[0, 0], anchor[0])
    assert torch.equal(z[0, 1], pair[0, 0, 0])
    assert torch.equal(z[0, 2], pair[0, 1, 1])

    def nll(row, g):
        return -(row[g] - math.log(sum(math.exp(x) for x in row)))

    want = (nll([1.0, 0.5, -1.0], 0) + nll([0.2, 2.0, 0.1], 1) + nll([0.0, 1.5, -2.0], 1)) / 3
    assert losses.lilicorr_ce(z, g_idx, prefix).item() == pytest.approx(want, rel=1e-5)
    # Only prefix slots count: with the prefix cut after slot 1, Eq. 3 averages one term.
    short = torch.tensor([[True, False, False]])
    assert losses.lilicorr_ce(z, g_idx, short).item() == pytest.approx(nll([1.0, 0.5, -1.0], 0), rel=1e-5)


def test_oracle_prefix_stops_at_first_uncovered_slot():
    cand = torch.tensor([[[5, 6, 7], [8, 9, 10], [11, 12, 13]],
                         [[5, 6, 7], [8, 9, 10], [11, 12, 13]],
                         [[5, 6, 7], [8, 9, 10], [11, 12, 13]]])
    labels = torch.tensor([[6, 99, 13],  # slot 2 missing -> slot 3 is not supervised although covered
                           [7, 8, 12],  # all covered
                           [1, 8, 12]])  # first slot misses -> nothing supervised
    valid = torch.ones(3, 3, dtype=torch.bool)
    g_idx, prefix = losses.oracle_prefix(cand, labels, valid)
    assert prefix.tolist() == [[True, False, False], [True, True, True], [False, False, False]]
    assert g_idx[1].tolist() == [2, 0, 1]
    assert g_idx[0, 0].item() == 1
    # An invalid label (outside the loss mask) also ends the prefix.
    valid[1, 1] = False
    assert losses.oracle_prefix(cand, labels, valid)[1][1].tolist() == [True, False, False]


def test_eq4_eq5_distractor_penalty_by_hand():
    z = torch.tensor([[[1.0, 0.0, -1.0], [0.5, 0.5, 2.0]]])  # (1, S=2, K=3)
    g_idx = torch.tensor([[0, 2]])
    logq = torch.log(torch.tensor([[[0.5, 0.2, 0.1], [0.3, 0.05, 0.4]]]))
    prefix = torch.tensor([[True, True]])

    def omega(zs, g, q):
        p = [math.exp(x) / sum(math.exp(y) for y in zs) for x in zs]
        return sum(pk * max(0.0, math.log(q[g]) - math.log(qk)) for pk, qk in zip(p, q))

    want = (omega([1.0, 0.0, -1.0], 0, [0.5, 0.2, 0.1]) + omega([0.5, 0.5, 2.0], 2, [0.3, 0.05, 0.4])) / 2
    got = losses.distractor_penalty(z, g_idx, logq, prefix)
    assert got.item() == pytest.approx(want, rel=1e-5)
    # The rectifier: candidates the target prefers over g cost nothing.
    logq2 = torch.log(torch.tensor([[[0.1, 0.5, 0.3], [0.3, 0.05, 0.4]]]))
    only = torch.tensor([[True, False]])
    assert losses.distractor_penalty(z, g_idx, logq2, only).item() == pytest.approx(0.0, abs=1e-7)


def test_eq6_dflash_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, -1.0, 0.5], [0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 3.0]]])  # (1, S=3, V=4)
    labels = torch.tensor([[0, 3, 1]])
    valid = torch.tensor([[True, True, False]])
    beta = 2.0

    def ce(row, y):
        return math.log(sum(math.exp(x) for x in row)) - row[y]

    w = [math.exp(-(s - 1) / beta) for s in (1, 2, 3)]
    rows = logits[0].tolist()
    want = (w[0] * ce(rows[0], 0) + w[1] * ce(rows[1], 3)) / (w[0] + w[1])
    assert losses.dflash_loss(logits, labels, valid, beta).item() == pytest.approx(want, rel=1e-5)


def test_eq13_margin_and_eq7_totals_by_hand():
    z = torch.tensor([[[3.0, 2.5, 0.0], [0.0, 4.0, 1.0], [1.0, 1.0, 0.5]]])
    g_idx = torch.tensor([[0, 1, 2]])
    prefix = torch.tensor([[True, True, True]])
    rho = 2.0
    gaps = [3.0 - 2.5, 4.0 - 1.0, 0.5 - 1.0]
    want = sum(max(0.0, rho - g) for g in gaps) / 3
    m = losses.margin_loss(z, g_idx, prefix, rho)
    assert m.item() == pytest.approx(want, rel=1e-6)
    d, c, di = torch.tensor(1.5), torch.tensor(0.7), torch.tensor(0.3)
    eq7 = losses.lilicorr_objective(d, c, di, m, LossConfig(gamma=0.25, lam=1.0, mu=0.0))
    assert eq7.item() == pytest.approx(1.5 + 0.25 * (0.7 + 1.0 * 0.3), rel=1e-6)
    blend = losses.lilicorr_objective(d, c, di, m, LossConfig(gamma=0.25, lam=2.0, mu=0.5, rho=rho))
    assert blend.item() == pytest.approx(1.5 + 0.25 * (0.5 * 0.7 + 2.0 * 0.3 + 0.5 * want), rel=1e-6)


def test_eq8_greedy_and_eq12_path_score_by_hand():
    anchor, pair = small_lattice()
    path = greedy_walk_reference(anchor, pair)
    # slot 1: argmax [1.0, 0.5, -1.0] = 0; slot 2: argmax pair[0, 0] = [0.2, 2.0, 0.1] -> 1;
    # slot 3: argmax pair[1, 1] = [0.0, 1.5, -2.0] -> 1
    assert path.tolist() == [[0, 1, 1]]
    assert path_score(anchor, pair, path).item() == pytest.approx(1.0 + 2.0 + 1.5)
    cand = torch.tensor([[[10, 11, 12], [20, 21, 22], [30, 31, 32]]])
    assert commit_tokens(cand, path).tolist() == [[10, 21, 31]]


def test_viterbi_gives_up_slot_1_for_a_better_total():
    # App. E: the exact maximizer of Eq. 12 sacrifices the best first slot for a richer tail.
    anchor = torch.tensor([[1.0, 0.9], [0.0, 1.0]])
    pair = torch.tensor([[[[0.0, 0.1], [5.0, 4.0]]],   # block 0: greedy 0 -> 1, viterbi 1 -> 0
                         [[[0.0, 0.0], [1.0, 0.0]]]])  # block 1: both rules agree (1 -> 0)
    g = decode_reference(anchor, pair, "greedy")
    v = decode_reference(anchor, pair, "viterbi")
    assert g.tolist() == [[0, 1], [1, 0]]
    assert v.tolist() == [[1, 0], [1, 0]]
    assert path_score(anchor, pair, v)[0] > path_score(anchor, pair, g)[0]
    assert anchor[0, g[0, 0]] > anchor[0, v[0, 0]]  # greedy keeps the better leading decision
    # Brute force over all K^S paths confirms Viterbi is the exact maximizer.
    best = max(((a, b) for a in range(2) for b in range(2)),
               key=lambda p: path_score(anchor[:1], pair[:1], torch.tensor([p]))[0].item())
    assert list(best) == v[0].tolist()
    assert torch.equal(viterbi_reference(anchor, pair), v)
