"""engine.adaptive_draft_survival: the per-block, per-row verification length (engine/adaptive_draft.py).

The rule by hand, its bounds, and losslessness: greedy outputs equal transformers' greedy `generate` for every chain
system with the option on, batched rows included, also when long drafted prefixes are correct; the target's pass
really holds fewer nodes; a seeded sampled row's output does not depend on its batch mates' widths. (At T > 0 the
output law is checked by test_engine_sampling.py's chi-square with the option on.)
"""

import copy
import math

import pytest
import torch

from lilicorr.engine import adaptive_draft
from lilicorr.engine.requests import Request
from lilicorr.engine.systems import build_decoder
from test_engine_lossless import CHAIN_SYSTEMS, pack_small_weights, run, setup  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread", "pack_small_weights")


def logits_with_top1(probs, vocab=8):
    """(1, S, vocab) logits whose softmax puts probs[s] on token 0 and the rest evenly on the others."""
    rows = [[math.log(p)] + [math.log((1 - p) / (vocab - 1))] * (vocab - 1) for p in probs]
    return torch.tensor([rows])


def test_the_rule_by_hand():
    # top-1 probabilities 0.9, 0.5, 0.8, 0.2 -> survival 0.9, 0.45, 0.36, 0.072
    logits = logits_with_top1([0.9, 0.5, 0.8, 0.2])
    conf = adaptive_draft.slot_confidence(logits, [0.0])  # a greedy row: its confidence at temperature 1
    assert conf[0].tolist() == pytest.approx([0.9, 0.5, 0.8, 0.2], abs=1e-6)
    lengths = {t: int(adaptive_draft.survival_lengths(conf, t)[0]) for t in (0.01, 0.07, 0.3, 0.4, 0.5, 0.95)}
    assert lengths == {0.01: 4, 0.07: 4, 0.3: 3, 0.4: 2, 0.5: 1, 0.95: 1}  # never below one draft
    # at T = 2 every probability goes to its square root before renormalising: 0.9 of 8 tokens becomes 0.7045...
    hot = adaptive_draft.slot_confidence(logits[:, :1], [2.0])
    assert float(hot) == pytest.approx(0.9 ** 0.5 / (0.9 ** 0.5 + 7 * (0.1 / 7) ** 0.5), abs=1e-6)
    # DSpark's own cut (num_proposed) is kept when shorter
    assert adaptive_draft.cut(torch.tensor([1]), logits, [0.0], 0.3).tolist() == [1]
    assert adaptive_draft.cut(torch.tensor([4]), logits, [0.0], 0.3).tolist() == [3]


@pytest.mark.parametrize("seed", range(5))
def test_lengths_stay_within_one_and_the_block(seed):
    g = torch.Generator().manual_seed(seed)
    c, s, v = 16, 7, 50
    logits = torch.randn(c, s, v, generator=g) * torch.rand(c, s, 1, generator=g) * 12
    temps = torch.rand(c, generator=g).tolist()
    for t in (1e-6, 0.01, 0.2, 0.5, 0.9, 0.999):
        lengths = adaptive_draft.survival_lengths(adaptive_draft.slot_confidence(logits, temps), t)
        assert lengths.dtype == torch.long and lengths.shape == (c,)
        assert int(lengths.min()) >= 1 and int(lengths.max()) <= s


def test_settings_it_cannot_take_raise(setup):
    cfg, model, *_ = setup
    for value in (-0.1, 1.0):
        bad = copy.deepcopy(cfg)
        bad.engine.adaptive_draft_survival = value
        with pytest.raises(ValueError, match="adaptive_draft_survival"):
            build_decoder(bad, model, "dflash", max_batch=1)
    tree = copy.deepcopy(cfg)
    tree.engine.adaptive_draft_survival = 0.2
    with pytest.raises(ValueError, match="tree head"):
        build_decoder(tree, model, "ddtree", max_batch=1)


def adaptive(cfg, survival):
    cfg = copy.deepcopy(cfg)
    cfg.engine.adaptive_draft_survival = survival
    return cfg


def count_widths(dec) -> list:
    widths, inner = [], dec.runner.target_pass
    dec.runner.target_pass = lambda tokens, *a, **k: widths.append(tokens.shape[1]) or inner(tokens, *a, **k)
    return widths


@pytest.mark.parametrize("system", CHAIN_SYSTEMS)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_is_the_targets_with_the_option_on(setup, system, batch):
    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(adaptive(cfg, 1e-3), model, system, stop_ids=stops, max_batch=batch)
    widths = count_widths(dec)
    assert [r.output_ids for r in run(dec, prompts)] == refs
    assert min(widths) < dec.runner.block  # some passes were cut (the prefill's are one row's prompt, not blocks)


def copy_the_reference(dec, refs, seed):
    """Wrap the head's proposal: drafts copy the reference for k ~ U{0..S} slots, then go wrong; and sharpen the
    drafter's logits by a random factor per slot (before the rule reads them) so lengths vary from 1 to S."""
    g = torch.Generator().manual_seed(seed)
    inner_logits, inner_propose = dec.runner.draft_logits, dec.runner.drafting.propose
    dec.runner.draft_logits = lambda h: inner_logits(h) * torch.rand(h.shape[0], h.shape[1], 1, generator=g) * 40
    V = dec.target.vocab_size

    def propose(rows, *a, **k):
        prop = inner_propose(rows, *a, **k)
        for s in range(prop.tokens.shape[0]):
            live = dec.slots[rows.start + s]
            if live is None or not live.running:
                continue
            ref, done = refs[live.request.id], len(live.result.output_ids)
            k_ok = int(torch.randint(0, prop.tokens.shape[1] + 1, (1,), generator=g))
            for j in range(prop.tokens.shape[1]):
                want = ref[done + j] if done + j < len(ref) else 0
                prop.tokens[s, j] = want if j < k_ok else (want + 1 + j) % V
        return prop

    dec.runner.drafting.propose = propose


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_long_correct_prefixes_cut_by_the_rule_stay_lossless(setup, batch):
    cfg, model, prompts, stops, refs = setup
    dec = build_decoder(adaptive(cfg, 0.3), model, "dflash", stop_ids=stops, max_batch=batch)
    copy_the_reference(dec, refs, seed=batch)
    widths = count_widths(dec)
    assert [r.output_ids for r in run(dec, prompts)] == refs
    s = dec.stats
    assert s.tau > 1.3  # multi-token prefixes were accepted
    assert sum(s.slot_proposed) < s.blocks * (dec.runner.block - 1)  # and rows were cut
    assert len(set(widths)) > 1  # passes of several widths


def test_a_seeded_row_ignores_its_batch_mates_widths(setup):
    cfg, model, prompts, *_ = setup
    req = lambda i, p: Request(i, p, max_new_tokens=10, temperature=1.0, seed=40 + i)  # noqa: E731
    on = adaptive(cfg, 1e-3)
    alone = build_decoder(on, model, "dflash", max_batch=1).generate([req(0, prompts[0])])[0].output_ids
    mixed = build_decoder(on, model, "dflash", max_batch=3).generate([req(5, prompts[5]), req(0, prompts[0]),
                                                                       req(7, prompts[7])])
    assert mixed[1].output_ids == alone


@pytest.mark.parametrize("system", ["dflash", "dspark-sampled"])  # deterministic and sampled proposals
def test_sampled_output_follows_the_target_with_rows_cut(system):
    """At T = 1 the first three tokens of 5-token requests (a block may offer 3 drafts, so the rule cuts some blocks,
    depending on the tokens sampled before them) follow the target's exact joint law (test_engine_sampling.py's
    chi-square)."""
    import numpy as np

    from engine_helpers import tiny_config, varied_random_target
    from test_engine_sampling import N_SAMPLES, PROMPT, V, chi2_pvalue, exact_joint

    cfg = tiny_config("llama", vocab_size=V, overrides=[
        "head.dspark_threshold=0.0", "engine.max_seq_len=16", "target.num_layers=3", "drafter.num_layers=1",
        "engine.prefill_token_budget=0", "engine.adaptive_draft_survival=0.05"])
    model = varied_random_target(cfg, seed=21, logit_scale=2.0)
    dec = build_decoder(cfg, model, system, max_batch=2500)
    res = dec.generate([Request(i, PROMPT, max_new_tokens=5, temperature=1.0, seed=3000 + i) for i in range(N_SAMPLES)])
    out = np.array([r.output_ids[:3] for r in res])
    assert chi2_pvalue(out[:, 0] * V * V + out[:, 1] * V + out[:, 2], exact_joint(model)) > 0.01
    offered = dec.stats.slot_proposed  # blocks that offered slot 1, 2: the rule cut some blocks and not others
    assert offered[0] > 1.2 * offered[1] > 0 and dec.stats.accepted_draft > 0.05 * N_SAMPLES
