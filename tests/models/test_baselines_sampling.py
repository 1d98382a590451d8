"""Sampling by exponential race (issue 16): argmax(p / Exp(1)), noise keyed by each row's own uniform."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lilicorr.engine.sampling import _mix64, exponential_race, race_noise, sample_with_uniform

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_race_by_hand():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.2, 0.3, 0.5, 0.0]])
    noise = torch.tensor([[1e-9, 2.0, 1e-9, 1.0], [0.1, 1.0, 1.0, 1e-9]])
    # Row 0 scores (0, 0.25, 0, 0.5); the tiny noise on the zero-probability tokens cannot help them.
    # Row 1 scores (2, 0.3, 0.5, 0).
    assert exponential_race(probs, noise).tolist() == [3, 0]


def splitmix64(seed: int, n: int) -> list[int]:
    """The reference generator (Steele et al.), in Python integers."""
    out, m = [], (1 << 64) - 1
    for _ in range(n):
        seed = (seed + 0x9E3779B97F4A7C15) & m
        z = seed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append(z ^ (z >> 31))
    return out


def test_noise_is_splitmix64_of_the_mixed_key():
    keys = torch.tensor([0, 1, 12345, 2 ** 53 - 1])
    noise = race_noise(keys, 5)
    for row, key in enumerate(keys.tolist()):
        seed = splitmix64(key - 0x9E3779B97F4A7C15, 1)[0]  # the finaliser of `key` itself
        assert _mix64(torch.tensor([key])).item() & ((1 << 64) - 1) == seed
        want = [-np.log((((z >> 11) + 0.5) * 2.0 ** -53)) for z in splitmix64(seed, 5)]
        assert np.allclose(noise[row].numpy(), want, rtol=1e-12)


def test_draws_follow_p_and_never_a_zero_probability_token():
    p = torch.tensor([0.0, 0.05, 0.0, 0.25, 0.6, 1e-7, 0.1 - 1e-7, 0.0])
    n = 60000
    u = torch.rand(n, generator=torch.Generator().manual_seed(5))
    x = sample_with_uniform(p[None].expand(n, -1) * 3.0, u).numpy()  # unnormalised probs are fine
    obs = np.bincount(x, minlength=len(p))
    assert obs[p.numpy() == 0].sum() == 0
    keep = p.numpy() > 1e-3

    def pvalue(q):
        q = q.astype(np.float64)
        return chisquare(obs[keep], q / q.sum() * obs[keep].sum()).pvalue

    assert pvalue(p.numpy()[keep]) > 0.01
    assert pvalue(p.numpy()[keep] ** (1 / 1.3)) < 1e-4  # the check has power: p at temperature 1.3 fails


def test_a_row_depends_on_its_own_uniform_only():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(5, 50, generator=g), -1)
    u = torch.rand(5, generator=g)
    together = sample_with_uniform(probs, u)
    alone = torch.stack([sample_with_uniform(probs[i:i + 1], u[i:i + 1])[0] for i in range(5)])
    assert torch.equal(together, alone)
    assert torch.equal(sample_with_uniform(probs, u), together)  # reproducible
    greedy = torch.zeros(1, 50).scatter_(1, torch.tensor([[17]]), 1.0)
    assert sample_with_uniform(greedy, torch.zeros(1)).item() == 17  # a greedy row's one-hot wins
