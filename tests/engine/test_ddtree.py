"""DDTree: the best-first tree is the top-`budget` set of prefix paths; decoding with it is lossless.

Greedy: output equals transformers' greedy `generate` with drafts whose top-k hold the target's
continuation at random ranks (so accepted paths run through later siblings, not only first children).
T = 1: the first three tokens follow the target's exact joint law (chi-square, as for the chain systems).
"""

import itertools

import pytest
import torch

from engine_helpers import tiny_config, varied_random_target
from lilicorr.engine.ddtree import best_first_tree, tree_depth
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tree_by_hand():
    # two slots, top-2 each: slot 1 {7: log .6, 8: log .4}, slot 2 {5: log .9, 6: log .1}
    logp = torch.tensor([[[0.6, 0.4], [0.9, 0.1]]]).log()
    ids = torch.tensor([[[7, 8], [5, 6]]])
    t = best_first_tree(torch.tensor([1]), logp, ids, torch.tensor([2]), budget=4)
    # scores: 7 (.6), 7-5 (.54), 8 (.4), 8-5 (.36), 7-6 (.06), 8-6 (.04) -> the best four, best first
    assert t.tokens[0].tolist() == [1, 7, 5, 8, 5]
    assert t.parents[0].tolist() == [-1, 0, 1, 0, 3]
    assert t.num_nodes.tolist() == [5] and tree_depth(t).tolist() == [2]
    shallow = best_first_tree(torch.tensor([1]), logp, ids, torch.tensor([1]), budget=4)  # depth budget 1
    assert shallow.num_nodes.tolist() == [3] and shallow.tokens[0, :3].tolist() == [1, 7, 8]
    none = best_first_tree(torch.tensor([1]), logp, ids, torch.tensor([0]), budget=4)
    assert none.num_nodes.tolist() == [1]


def test_tree_is_the_top_budget_prefix_paths():
    g = torch.Generator().manual_seed(0)
    c, s, k, budget = 5, 3, 3, 9
    logp, ids = torch.randn(c, s, 20, generator=g).log_softmax(-1).topk(k, -1)
    depth = torch.tensor([3, 2, 1, 3, 0])
    t = best_first_tree(torch.zeros(c, dtype=torch.long), logp, ids, depth, budget)
    for row in range(c):
        paths = [p for d in range(1, int(depth[row]) + 1) for p in itertools.product(range(k), repeat=d)]
        scores = sorted((sum(float(logp[row, j, r]) for j, r in enumerate(p)) for p in paths), reverse=True)
        n = int(t.num_nodes[row]) - 1
        assert n == min(budget, len(paths))
        got = []
        for node in range(1, n + 1):  # score of each node = its path's summed log-prob
            total, cur = 0.0, node
            while cur > 0:
                d = 0
                a = cur
                while int(t.parents[row, a]) > 0:
                    a, d = int(t.parents[row, a]), d + 1
                rank = int((ids[row, d] == t.tokens[row, cur]).nonzero()[0])
                total += float(logp[row, d, rank])
                cur = int(t.parents[row, cur])
            got.append(total)
        assert sorted(got, reverse=True) == pytest.approx(scores[:n], abs=1e-5)
        siblings = {}
        for node in range(1, n + 1):  # children of a node carry distinct tokens (the verifier needs it)
            siblings.setdefault(int(t.parents[row, node]), []).append(int(t.tokens[row, node]))
        assert all(len(v) == len(set(v)) for v in siblings.values())


@pytest.fixture(scope="module")
def greedy_setup():
    cfg = tiny_config("llama", overrides=["engine.ddtree_top_k=3", "engine.ddtree_budget=7"])
    model = varied_random_target(cfg, seed=11)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, cfg.target.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 5, 1)]
    refs = [model.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    return cfg, model, prompts, refs


def test_ddtree_greedy_equals_target_greedy(greedy_setup):
    cfg, model, prompts, refs = greedy_setup
    dec = build_decoder(cfg, model, "ddtree", max_batch=2)
    head = dec.runner.drafting.head
    inner = head.propose
    g = torch.Generator().manual_seed(3)

    def oracle(slot_logits, *args, **kw):
        """Put the target's continuation inside each slot's top-k at a random rank, up to a random slot."""
        logits = slot_logits.clone()
        for row in range(logits.shape[0]):
            live = dec.slots[row]
            if live is None or not live.running:
                continue
            ref, done = refs[live.request.id], len(live.result.output_ids)
            cut = int(torch.randint(0, logits.shape[1] + 1, (1,), generator=g))
            for j in range(min(cut, len(ref) - done - 1)):
                top = logits[row, j].topk(3).values
                rank = int(torch.randint(0, 3, (1,), generator=g))
                value = top[0] + 1 if rank == 0 else (top[rank - 1] + top[rank]) / 2
                logits[row, j, ref[done + j]] = value
        return inner(logits, *args, **kw)

    head.propose = oracle
    res = dec.generate([Request(i, p, max_new_tokens=16) for i, p in enumerate(prompts)])
    assert [r.output_ids for r in res] == refs
    assert dec.stats.accepted_draft > 0  # trees were accepted beyond their anchors
    assert dec.runner.block == 8  # 7 draft nodes + the anchor verified together


def test_ddtree_random_drafter_greedy_equals_target(greedy_setup):
    cfg, model, prompts, refs = greedy_setup
    dec = build_decoder(cfg, model, "ddtree", max_batch=3)
    assert [r.output_ids for r in dec.generate([Request(i, p, max_new_tokens=16) for i, p in enumerate(prompts)])] == refs


def test_ddtree_samples_the_target_distribution():
    """The first three tokens at T = 1 against the target's exact joint law (6k runs: a third of the chain
    systems' sample, enough to catch a wrong tree rule; verify.py's own tree test is the dense one)."""
    import numpy as np

    from test_engine_sampling import PROMPT, V, chi2_pvalue, exact_joint

    cfg = tiny_config("llama", vocab_size=V, overrides=["engine.max_seq_len=16", "target.num_layers=3",
                                                         "drafter.num_layers=1", "engine.prefill_token_budget=0",
                                                         "engine.ddtree_budget=5", "engine.ddtree_top_k=3"])
    model = varied_random_target(cfg, seed=21, logit_scale=2.0)
    dec = build_decoder(cfg, model, "ddtree", max_batch=3000)
    res = dec.generate([Request(i, PROMPT, max_new_tokens=3, temperature=1.0, seed=77 + i) for i in range(6000)])
    out = np.array([r.output_ids for r in res])
    assert dec.stats.accepted_draft > 0.1 * dec.stats.blocks  # trees do get accepted
    assert chi2_pvalue(out[:, 0] * V * V + out[:, 1] * V + out[:, 2], exact_joint(model)) > 1e-3
