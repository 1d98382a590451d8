"""The plain-torch references of lilicorr.kernels, checked against numbers computed by hand. The fast paths against
these references: tests/parity/."""

from __future__ import annotations

import itertools
import math
import pytest
import torch

from lilicorr.kernels.lattice import (
    greedy_walk_reference,
    lattice_scores_reference,
    match_and_walk,
    viterbi_reference,
)
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax_reference

R2 = math.sqrt(2.0)


# ---------------------------------------------------------------- lattice, by hand
def hand_lattice():
    """3 slots, K = 2, d = 2, sigma = 2. Raw (non-unit) vectors; cosines are 0, +-1 or +-1/sqrt2.

    anchor (1, 0) . in slot 0: (1, 1) -> 1/sqrt2, (3, 0) -> 1          anchor = [sqrt2, 2]
    out slot 0:  (0, 1)  . in slot 1 (0, 5), (1, 0) -> [1, 0]           pair[0] = [[2, 0],
                 (-1,-1) .                          -> [-1/sqrt2]*2               [-sqrt2, -sqrt2]]
    out slot 1:  (2, 0)  . in slot 2 (1, 0), (0, -1) -> [1, 0]          pair[1] = [[2, 0],
                 (0, -3) .                           -> [0, 1]                    [0, 2]]
    Greedy: slot 0 takes 1 (2 > sqrt2); slot 1 ties at -sqrt2 -> 0; slot 2 -> 0: path [1, 0, 0],
            total 2 - sqrt2 + 2 = 2.586.
    Viterbi: [0, 0, 0] scores sqrt2 + 2 + 2 = 5.414, the best of the 8 paths: it gives up the
            first slot's better match for a better total (App. E).
    """
    anchor = torch.tensor([[1.0, 0.0]])  # (C=1, d)
    in_vecs = torch.tensor([[[[1.0, 1.0], [3.0, 0.0]], [[0.0, 5.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, -1.0]]]])
    out_vecs = torch.tensor([[[[0.0, 1.0], [-1.0, -1.0]], [[2.0, 0.0], [0.0, -3.0]], [[7.0, 7.0], [1.0, 2.0]]]])
    return out_vecs, in_vecs, anchor, 2.0


def test_lattice_scores_by_hand():
    anchor, pair = lattice_scores_reference(*hand_lattice())
    assert anchor.shape == (1, 2) and pair.shape == (1, 2, 2, 2)
    torch.testing.assert_close(anchor, torch.tensor([[R2, 2.0]]))
    torch.testing.assert_close(pair[0, 0], torch.tensor([[2.0, 0.0], [-R2, -R2]]))
    torch.testing.assert_close(pair[0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))


def test_greedy_and_viterbi_by_hand():
    anchor, pair = lattice_scores_reference(*hand_lattice())
    assert greedy_walk_reference(anchor, pair).tolist() == [[1, 0, 0]]
    assert viterbi_reference(anchor, pair).tolist() == [[0, 0, 0]]
    # The same through the public dispatch (CPU tensors -> references).
    assert match_and_walk(*hand_lattice(), rule="greedy").tolist() == [[1, 0, 0]]
    assert match_and_walk(*hand_lattice(), rule="viterbi").tolist() == [[0, 0, 0]]


def test_zero_vector_scores_zero_not_nan():
    out_vecs, in_vecs, anchor, sigma = hand_lattice()
    in_vecs[0, 0, 1] = 0.0  # eps-clamped norm: cos = 0, as torch.nn.functional.cosine_similarity
    a, _ = lattice_scores_reference(out_vecs, in_vecs, anchor, sigma)
    assert a[0, 1].item() == 0.0
    ref = sigma * torch.nn.functional.cosine_similarity(anchor, in_vecs[:, 0, 1], dim=-1)
    assert ref.item() == 0.0


def test_scores_match_cosine_similarity():
    g = torch.Generator().manual_seed(1)
    o, i, a = torch.randn(3, 4, 5, 7, generator=g), torch.randn(3, 4, 5, 7, generator=g), torch.randn(3, 7, generator=g)
    anchor, pair = lattice_scores_reference(o, i, a, 8.0)
    cos = torch.nn.functional.cosine_similarity
    torch.testing.assert_close(anchor, 8.0 * cos(a[:, None, :], i[:, 0], dim=-1))
    torch.testing.assert_close(pair, 8.0 * cos(o[:, :-1, :, None, :], i[:, 1:, None, :, :], dim=-1))


def _path_score(anchor, pair, path):
    return anchor[path[0]] + sum(pair[s, path[s], path[s + 1]] for s in range(len(path) - 1))


def test_viterbi_is_the_exact_maximizer():
    """Enumerate all K^S paths of small random lattices; ties resolved towards lower indices."""
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        s, k = 4, 3
        anchor = torch.randn(1, k, generator=g).double()
        pair = torch.randn(1, s - 1, k, k, generator=g).double()
        best = max(
            itertools.product(range(k), repeat=s), key=lambda p: (_path_score(anchor[0], pair[0], p).item(), [-x for x in p])
        )
        assert viterbi_reference(anchor, pair)[0].tolist() == list(best)


def test_ties_go_to_lowest_index():
    anchor = torch.zeros(2, 4)  # every score equal
    pair = torch.zeros(2, 5, 4, 4)
    assert greedy_walk_reference(anchor, pair).tolist() == [[0] * 6] * 2
    assert viterbi_reference(anchor, pair).tolist() == [[0] * 6] * 2
    anchor[:, 2] = anchor[:, 3] = 1.0  # tie between candidates 2 and 3 at slot 0
    pair[:, 0, 2, 1] = pair[:, 0, 2, 3] = 5.0
    assert greedy_walk_reference(anchor, pair)[:, :2].tolist() == [[2, 1]] * 2
    assert viterbi_reference(anchor, pair)[:, :2].tolist() == [[2, 1]] * 2


def test_greedy_commits_argmax_of_successors():
    g = torch.Generator().manual_seed(3)
    anchor, pair = torch.randn(6, 8, generator=g), torch.randn(6, 14, 8, 8, generator=g)
    path = greedy_walk_reference(anchor, pair)
    for c in range(6):
        assert path[c, 0] == anchor[c].argmax()
        for s in range(14):
            assert path[c, s + 1] == pair[c, s, path[c, s]].argmax()


# ---------------------------------------------------------------- top-K log-softmax, by hand
def test_topk_logsoftmax_by_hand():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    r = topk_logsoftmax_reference(logits, 3)
    assert r.ids.tolist() == [[1, 2, 0], [0, 1, 2]]  # ties: lower id first
    lse = math.log(math.e + 2 * math.e**3 + 1.0)
    torch.testing.assert_close(r.logprobs[0], torch.tensor([3 - lse, 3 - lse, 1 - lse]))
    torch.testing.assert_close(r.logprobs[1], torch.full((3,), -math.log(4.0)))
    lp = 1 - lse
    torch.testing.assert_close(r.features[0, 2], torch.tensor([lp, math.exp(lp), -2.0, 1.0, 0.0]))
    torch.testing.assert_close(r.features[0, 0], torch.tensor([3 - lse, math.exp(3 - lse), 0.0, 0.0, 1.0]))
    torch.testing.assert_close(r.features[0, 1, 3], torch.tensor(0.5))


def test_topk_k1_rank_feature_is_zero():
    r = topk_logsoftmax_reference(torch.tensor([[0.0, 2.0, 1.0]]), 1)
    assert r.ids.tolist() == [[1]]
    assert r.features[0, 0, 3].item() == 0.0 and r.features[0, 0, 4].item() == 1.0


def test_topk_boundary_ties_keep_lowest_ids():
    x = torch.full((1, 10), -1.0)
    x[0, 7] = 2.0
    x[0, [2, 5, 8]] = 1.0  # three tied for two remaining places
    assert topk_logsoftmax_reference(x, 3).ids.tolist() == [[7, 2, 5]]


def test_topk_very_negative_logits():
    inf = float("inf")
    x = torch.tensor([[-inf, -1e30, 0.5, -inf, -1e30, -inf]])
    r = topk_logsoftmax_reference(x, 5)
    assert r.ids.tolist() == [[2, 1, 4, 0, 3]]
    assert r.logprobs[0, 0].item() == 0.0  # all mass on the one finite logit
    assert r.logprobs[0, 1].item() == torch.tensor(-1e30).item() and r.logprobs[0, 3].item() == -inf
    assert r.features[0, 3, 1].item() == 0.0 and r.features[0, 3, 2].item() == -inf
    assert not r.features.isnan().any()


def test_topk_bf16_matches_fp32_of_same_values():
    x = torch.randn(3, 500).to(torch.bfloat16)
    a, b = topk_logsoftmax_reference(x, 8), topk_logsoftmax_reference(x.float(), 8)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.logprobs.dtype == torch.float32 and a.ids.dtype == torch.int64


def test_topk_reference_gradient():
    """d/dx_j sum_{i in top-K} log_softmax(x)_i = [j in top-K] - K softmax(x)_j."""
    x = torch.randn(2, 50, dtype=torch.float32, requires_grad=True)
    r = topk_logsoftmax_reference(x, 4)
    r.logprobs.sum().backward()
    expected = -4 * torch.softmax(x.detach(), -1)
    expected.scatter_add_(1, r.ids, torch.ones(2, 4))
    torch.testing.assert_close(x.grad, expected)


def test_topk_matches_torch_topk_without_ties():
    x = torch.randn(7, 3000)
    r = topk_logsoftmax_reference(x, 16)
    v, i = torch.topk(x, 16)
    assert torch.equal(r.ids, i)
    torch.testing.assert_close(r.logprobs, torch.log_softmax(x, -1).gather(1, i))


@pytest.mark.parametrize("rule", ["greedy", "viterbi", "beam"])
def test_match_and_walk_rule_names(rule):
    if rule == "beam":
        with pytest.raises(ValueError):
            match_and_walk(*hand_lattice(), rule=rule)
    else:
        assert match_and_walk(*hand_lattice(), rule=rule).shape == (1, 3)
