"""95% bootstrap intervals for the figures a benchmark or an evaluation reports: τ pooled over prompts, a
ratio of two systems' τ on the same prompts, a ratio of two systems' speed on the same interleaved units.

Every statistic takes an (n, k) array of per-unit rows and pools the rows (sums, then divides), so the
point value is the pooled figure the tables print and the interval resamples units, never tokens.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

BOOTSTRAP = 2000


def interval(values: np.ndarray, stat: Callable[[np.ndarray], float], rng: np.random.Generator) -> tuple[float, float]:
    """95% percentile bootstrap interval of stat(BOOTSTRAP resamplings of the rows of `values`)."""
    n = len(values)
    idx = rng.integers(0, n, size=(BOOTSTRAP, n))
    stats = np.array([stat(values[i]) for i in idx])
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def pooled_tau(rows: np.ndarray) -> float:
    """rows (n, 2): per prompt (accepted draft tokens, blocks) -> τ = 1 + Σaccepted / Σblocks."""
    return 1.0 + rows[:, 0].sum() / max(rows[:, 1].sum(), 1)


def paired_ratio(rows: np.ndarray) -> float:
    """rows (n, 4): per prompt (accepted_A, blocks_A, accepted_B, blocks_B) -> τ_A / τ_B."""
    return pooled_tau(rows[:, :2]) / pooled_tau(rows[:, 2:])


def speed_ratio(rows: np.ndarray) -> float:
    """rows (n, 4): per timed unit (tokens_A, seconds_A, tokens_B, seconds_B) -> (ΣtokA/ΣsecA) / (ΣtokB/ΣsecB)."""
    a = rows[:, 0].sum() / max(rows[:, 1].sum(), 1e-12)
    b = rows[:, 2].sum() / max(rows[:, 3].sum(), 1e-12)
    return a / b if b else float("nan")
