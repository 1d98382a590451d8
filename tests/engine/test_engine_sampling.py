"""At T > 0 speculative decoding samples exactly the target's distribution (chi-square on 20k runs).

A 16-token vocabulary makes the joint law of the first three generated tokens (4096 cells) small
enough to compute exactly from the target and to sample densely. Seeds: per-request generators give
reproducible outputs that do not depend on which requests share a batch.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lilicorr.engine.requests import Request
from lilicorr.engine.sampling import target_probs
from lilicorr.engine.systems import build_decoder
from engine_helpers import tiny_config, varied_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, N_SAMPLES, PROMPT = 16, 20000, [3, 9, 1, 4]


@pytest.fixture(scope="module")
def model():
    # dspark_threshold=0: the random confidence head never cuts, so every slot is verified.
    # prefill_token_budget=0: thousands of 4-token prompts prefill in one step (no budget).
    cfg = tiny_config("llama", vocab_size=V, overrides=["head.dspark_threshold=0.0", "engine.max_seq_len=16",
                                                         "target.num_layers=3", "drafter.num_layers=1",
                                                         "engine.prefill_token_budget=0"])
    return cfg, varied_random_target(cfg, seed=21, logit_scale=2.0)


def exact_joint(model, top_k=0, top_p=1.0, temperature=1.0):
    """P(x1, x2, x3) under the target with its own sampling rule (4096,)."""
    temp = torch.full((1,), temperature)
    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([PROMPT])).logits[:, -1:], temp, top_k, top_p)[0, 0]  # (V,)
        pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # (V*V, 2) as (x1, x2)
        seqs = torch.cat([torch.tensor(PROMPT).expand(V * V, -1), pairs], 1)
        logits = model(seqs).logits  # (V*V, P+2, V)
        t = torch.full((V * V,), temperature)
        p2 = target_probs(logits[:, -2:-1], t, top_k, top_p)[:, 0]  # (V*V, V): row (x1, .) -> x2
        p3 = target_probs(logits[:, -1:], t, top_k, top_p)[:, 0]  # row (x1, x2) -> x3
    p2 = p2.view(V, V, V)[:, 0]  # depends on x1 only
    joint = p1[:, None, None] * p2[:, :, None] * p3.view(V, V, V)
    return joint.flatten().double().numpy()


def sample_first_three(cfg, model, system, overrides=(), batch=2500):
    from lilicorr.config import load_config

    run_cfg = load_config("tiny-random", [f"{k}={v}" for k, v in cfg.flat().items() if k != "preset"
                                          and not isinstance(v, (list, tuple)) and v is not None] + list(overrides))
    dec = build_decoder(run_cfg, model, system, max_batch=batch)
    reqs = [Request(i, PROMPT, max_new_tokens=3, temperature=1.0, seed=1000 + i) for i in range(N_SAMPLES)]
    res = dec.generate(reqs)
    out = np.array([r.output_ids for r in res])  # (N, 3)
    return out[:, 0] * V * V + out[:, 1] * V + out[:, 2], dec.stats


def chi2_pvalue(cells, probs):
    obs = np.bincount(cells, minlength=len(probs)).astype(float)
    exp = probs * len(cells)
    assert obs[exp == 0].sum() == 0, "sampled a token sequence the target gives probability 0"
    keep = exp >= 5
    obs_k, exp_k = obs[keep], exp[keep]
    if exp[~keep].sum() > 0:  # pool the rare cells into one
        obs_k, exp_k = np.append(obs_k, obs[~keep].sum()), np.append(exp_k, exp[~keep].sum())
    return chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue


@pytest.mark.parametrize("system,overrides", [
    ("ar", ()),
    ("dflash", ()),  # deterministic proposal
    ("dspark-sampled", ()),  # sampled proposal with q
    ("dflash", ("engine.top_k=6", "engine.top_p=0.9")),
])
def test_first_three_tokens_follow_the_target(model, system, overrides):
    cfg, m = model
    kw = dict(o.split("=") for o in overrides)
    probs = exact_joint(m, top_k=int(kw.get("engine.top_k", 0)), top_p=float(kw.get("engine.top_p", 1.0)))
    cells, stats = sample_first_three(cfg, m, system, overrides)
    assert chi2_pvalue(cells, probs) > 0.01
    if system != "ar":
        assert stats.accepted_draft > 0.05 * N_SAMPLES  # drafts were really accepted and rejected
        assert stats.accepted_draft < stats.blocks * (stats.block_size - 1)


def test_a_wrong_sampler_fails_the_same_check(model):
    """The check has power: sampling at T=1.3 instead of 1 is rejected."""
    cfg, m = model
    probs = exact_joint(m)
    dec = build_decoder(cfg, m, "ar", max_batch=5000)
    res = dec.generate([Request(i, PROMPT, max_new_tokens=3, temperature=1.3, seed=i) for i in range(5000)])
    out = np.array([r.output_ids for r in res])
    assert chi2_pvalue(out[:, 0] * V * V + out[:, 1] * V + out[:, 2], probs) < 1e-4


def test_seeds_reproduce_outputs_independently_of_batch_mates(model):
    cfg, m = model
    req = lambda i: Request(i, PROMPT, max_new_tokens=6, temperature=1.0, seed=77 + i)  # noqa: E731
    alone = build_decoder(cfg, m, "dflash", max_batch=1).generate([req(0)])[0].output_ids
    mixed = build_decoder(cfg, m, "dflash", max_batch=4).generate([req(5), req(0), req(9)])
    assert mixed[1].output_ids == alone
    again = build_decoder(cfg, m, "dflash", max_batch=4).generate([req(5), req(0), req(9)])
    assert [r.output_ids for r in again] == [r.output_ids for r in mixed]


def test_mixed_temperatures_in_one_batch_follow_the_target(model):
    """Rows at T=1, at T=0.6 with top_k=6 / top_p=0.9, and greedy rows share every batch; the sampled
    proposer draws each row at that row's own temperature. Each group follows its own law."""
    cfg, m = model
    groups = [dict(temperature=1.0), dict(temperature=0.6, top_k=6, top_p=0.9), dict(temperature=0.0)]
    dec = build_decoder(cfg, m, "dspark-sampled", max_batch=2500)
    reqs = [Request(i, PROMPT, max_new_tokens=3, seed=5000 + i, **groups[i % 3]) for i in range(N_SAMPLES)]
    out = np.array([r.output_ids for r in dec.generate(reqs)])
    cells = out[:, 0] * V * V + out[:, 1] * V + out[:, 2]
    for g, kw in enumerate(groups[:2]):
        probs = exact_joint(m, kw.get("top_k", 0), kw.get("top_p", 1.0), kw["temperature"])
        assert chi2_pvalue(cells[g::3], probs) > 0.01
    greedy = np.unique(cells[2::3])
    assert len(greedy) == 1 and greedy[0] == exact_joint(m, temperature=1e-4).argmax()
    assert dec.stats.accepted_draft > 0.05 * N_SAMPLES
