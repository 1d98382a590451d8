"""The verifier alone: greedy prefix + bonus by hand, and exactness of the sampling rules by counting."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lilicorr.engine.candidates import Candidates, chain
from lilicorr.engine.sampling import sample_with_uniform, target_probs
from lilicorr.engine.verify import verify, verify_greedy


def one_hot(ids, V):
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_greedy_accepts_longest_matching_prefix_plus_bonus():
    V = 10
    # Target argmax after each node: node0 -> 3, node1 -> 4, node2 -> 9, node3 -> 1
    p = one_hot([[3, 4, 9, 1], [3, 4, 9, 1], [3, 4, 9, 1]], V)  # (3, 4, V)
    drafts = torch.tensor([[3, 4, 5], [7, 4, 9], [3, 4, 9]])
    cands = chain(torch.tensor([0, 0, 0]), drafts, torch.tensor([3, 3, 2]))
    v = verify(p, cands, torch.zeros(3, 4, 2))
    assert v.num_accepted.tolist() == [2, 0, 2]
    assert v.next_token.tolist() == [9, 3, 9]  # row 2: only 2 proposed, so the bonus follows node 2
    assert v.path[0, :3].tolist() == [0, 1, 2]


def test_greedy_tree_walks_to_the_matching_child():
    V = 10
    p = one_hot([[5, 2, 6, 8, 0]], V)  # target argmax after each node
    tokens = torch.tensor([[1, 4, 5, 6, 2]])  # root 1 -> {4, 5}; 4 -> 6 (node 3); 5 -> 2 (node 4)
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    cands = Candidates(tokens, parents, torch.tensor([5]), is_chain=False)
    v = verify(p, cands, torch.zeros(1, 5, 2))
    # after root the target wants 5 -> node 2; after node 2 it wants 6, but node 2's child is 2 -> stop.
    assert v.num_accepted.item() == 1 and v.path[0, 1].item() == 2
    assert v.next_token.item() == 6


def test_verify_greedy_from_logits_matches_the_hand_walks():
    """The greedy fast path on logits whose argmax is the one-hot p of the two tests above."""
    logits = torch.randn(3, 4, 10) + 20 * one_hot([[3, 4, 9, 1], [3, 4, 9, 1], [3, 4, 9, 1]], 10)
    cands = chain(torch.tensor([0, 0, 0]), torch.tensor([[3, 4, 5], [7, 4, 9], [3, 4, 9]]), torch.tensor([3, 3, 2]))
    v = verify_greedy(logits, cands)
    assert v.num_accepted.tolist() == [2, 0, 2] and v.next_token.tolist() == [9, 3, 9]
    assert v.path[0, :3].tolist() == [0, 1, 2]
    tree = Candidates(torch.tensor([[1, 4, 5, 6, 2]]), torch.tensor([[-1, 0, 0, 1, 2]]), torch.tensor([5]), False)
    v = verify_greedy(torch.randn(1, 5, 10) + 20 * one_hot([[5, 2, 6, 8, 0]], 10), tree)
    assert v.num_accepted.item() == 1 and v.path[0, 1].item() == 2 and v.next_token.item() == 6


@pytest.mark.parametrize("is_chain", [True, False])
def test_verify_greedy_equals_verify_on_one_hot_probs(is_chain):
    """Random chains and trees whose tokens often hit the argmax: the same verdict as the general rule."""
    g = torch.Generator().manual_seed(3)
    c, n, V = 64, 6, 5  # a small vocabulary: drafts match the argmax often, so walks go deep
    logits = torch.randn(c, n, V, generator=g)
    if is_chain:
        best = logits.argmax(-1)[:, :n - 1]  # a draft that is the argmax 70% of the time
        drafts = torch.where(torch.rand(c, n - 1, generator=g) < 0.7, best, torch.randint(0, V, (c, n - 1), generator=g))
        cands = chain(torch.zeros(c, dtype=torch.long), drafts, torch.randint(0, n, (c,), generator=g))
    else:  # node j's parent is a random earlier node; siblings get distinct tokens by construction
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)])
                               for _ in range(c)])
        tokens = torch.zeros(c, n, dtype=torch.long)
        for r in range(c):
            for j in range(1, n):
                used = {int(tokens[r, k]) for k in range(1, j) if parents[r, k] == parents[r, j]}
                tokens[r, j] = [t for t in torch.randperm(V, generator=g).tolist() if t not in used][0]
        cands = Candidates(tokens, parents, torch.full((c,), n), is_chain=False)
    fast = verify_greedy(logits, cands)
    ref = verify(target_probs(logits, torch.zeros(c)), cands, torch.rand(c, n, 2, generator=g))
    assert torch.equal(fast.num_accepted, ref.num_accepted) and torch.equal(fast.next_token, ref.next_token)
    assert torch.equal(fast.stop_node, ref.stop_node)
    for r in range(c):
        k = int(ref.num_accepted[r])
        assert torch.equal(fast.path[r, :k + 1], ref.path[r, :k + 1])
    assert int(ref.num_accepted.max()) >= 2  # the walks went past the first node


def _committed_first_two(v, cands):
    """(first committed token, second committed token or -1) per row."""
    first = torch.where(v.num_accepted >= 1, cands.tokens.gather(1, v.path[:, 1:2])[:, 0], v.next_token)
    second = torch.where(v.num_accepted >= 2, cands.tokens.gather(1, v.path[:, 2:3])[:, 0],
                         torch.where(v.num_accepted == 1, v.next_token, torch.full_like(first, -1)))
    return first, second


def _chi2_ok(observed_tokens, probs, n):
    obs = np.bincount(observed_tokens, minlength=len(probs)).astype(float)
    exp = probs * n
    keep = exp > 5
    obs_k, exp_k = obs[keep], exp[keep]
    # fold the rare cells into one
    obs_k = np.append(obs_k, obs[~keep].sum())
    exp_k = np.append(exp_k, exp[~keep].sum())
    if exp_k[-1] == 0:
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
    return chisquare(obs_k, exp_k).pvalue


@pytest.mark.parametrize("contract", ["deterministic", "sampled", "tree"])
def test_sampling_rules_reproduce_the_target_distribution(contract):
    V, n = 6, 40000
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, V, generator=g) * 1.5  # target after node 0, 1, 2
    p_nodes = torch.softmax(logits, -1)
    p = p_nodes[None].expand(n, -1, -1)  # (n, 3, V); the conditional after node 1 is p_nodes[1]
    q = None
    if contract == "deterministic":
        cands = chain(torch.zeros(n, dtype=torch.long), torch.tensor([[2, 4]]).expand(n, -1), torch.full((n,), 2))
    elif contract == "sampled":
        q_nodes = torch.softmax(torch.randn(2, V, generator=g), -1)  # draft distributions of slot 1, 2
        d1 = torch.multinomial(q_nodes[0], n, replacement=True, generator=g)
        d2 = torch.multinomial(q_nodes[1], n, replacement=True, generator=g)
        cands = chain(torch.zeros(n, dtype=torch.long), torch.stack([d1, d2], 1), torch.full((n,), 2))
        q = torch.cat([torch.zeros(1, V), q_nodes])[None].expand(n, -1, -1)
    else:  # root with two deterministic children (tokens 2 and 4), node 1 has child token 0
        tokens = torch.tensor([[0, 2, 4]]).expand(n, -1)
        parents = torch.tensor([[-1, 0, 0]]).expand(n, -1)
        cands = Candidates(tokens, parents, torch.full((n,), 3), is_chain=False)
    u = torch.rand(n, 3, 2, generator=g)
    v = verify(p, cands, u, q)
    first, second = _committed_first_two(v, cands)
    assert _chi2_ok(first.numpy(), p_nodes[0].numpy(), n) > 0.01
    if contract != "tree":
        # Given the first slot's token was accepted, the next token follows p after node 1.
        draft1 = cands.tokens[:, 1]
        sel = (first == draft1) & (v.num_accepted >= 1)
        m = int(sel.sum())
        assert m > 1000
        assert _chi2_ok(second[sel].numpy(), p_nodes[1].numpy(), m) > 0.01


def test_target_probs_greedy_rows_and_top_k_top_p():
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0]], [[2.0, 1.0, 0.5, -1.0]]])
    p = target_probs(logits, torch.tensor([0.0, 1.0]), top_k=3, top_p=0.8)
    assert p[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    sm = torch.softmax(torch.tensor([2.0, 1.0, 0.5]), -1)
    # top-3 keeps {0,1,2}; top-p 0.8: mass above token 1 is sm[0] = 0.63 < 0.8 -> kept; above token 2 is 0.86 -> cut.
    want = torch.tensor([sm[0], sm[1], 0.0, 0.0])
    assert torch.allclose(p[1, 0], want / want.sum(), atol=1e-6)


def test_sampling_skips_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]]).expand(400, -1)
    drawn = sample_with_uniform(probs, torch.rand(400, generator=torch.Generator().manual_seed(0)))
    assert set(drawn.tolist()) == {1, 3}  # exponential race: both live tokens, never a zero-probability one
