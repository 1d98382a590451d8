"""jobs/bench.py acceptance's statistics against hand-computed values: pooled τ, the paired ratio, its interval."""

import numpy as np

from lilicorr.platform.intervals import interval, paired_ratio, pooled_tau


def test_pooled_tau_counts_blocks_not_prompts():
    # prompt 1: 1 accepted in 2 blocks, prompt 2: 3 in 2 -> 1 + 4/4, not the mean of 1.5 and 2.5 weighted otherwise
    assert pooled_tau(np.array([[1.0, 2.0], [3.0, 2.0]])) == 2.0
    assert pooled_tau(np.array([[0.0, 5.0]])) == 1.0


def test_paired_ratio_and_its_interval():
    rows = np.array([[1.0, 2.0, 0.0, 2.0], [3.0, 2.0, 2.0, 2.0]])  # A: τ 2.0; B: 1 + 2/4 = 1.5
    assert abs(paired_ratio(rows) - 2.0 / 1.5) < 1e-12
    rng = np.random.default_rng(0)
    same = np.tile([[2.0, 4.0, 1.0, 4.0]], (30, 1))  # every prompt alike: no spread to resample
    lo, hi = interval(same, paired_ratio, rng)
    assert abs(lo - 1.5 / 1.25) < 1e-12 and abs(hi - 1.5 / 1.25) < 1e-12
    # A accepts one more token than B on every prompt but with noise: the interval holds the estimate, above 1
    noisy = np.column_stack([rng.integers(2, 9, 200), np.full(200, 10.0), rng.integers(0, 7, 200), np.full(200, 10.0)])
    lo, hi = interval(noisy.astype(float), paired_ratio, rng)
    assert lo < paired_ratio(noisy.astype(float)) < hi and lo > 1.0
