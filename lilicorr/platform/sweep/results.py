"""Sweep results: one record per trial, grouped over seeds (mean ± sample std), tables and the τ figure."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class TrialRecord:
    trial_id: str
    stage: str  # "s1" (search) | "s2" (seeds) | "ab" (ablation)
    overrides: dict[str, str]  # swept section.field -> value (the seed under train.seed in s2 / ab)
    tau: Optional[float]  # last reported validation τ (None: the trial never validated)
    step: int = 0  # training step of that report
    status: str = "completed"  # completed | stopped (ASHA) | error
    run_id: Optional[str] = None  # MLflow child run
    trial_dir: Optional[str] = None
    arm: str = ""  # ablation arm name
    metrics: dict[str, float] = field(default_factory=dict)

    def group_key(self) -> str:
        """The config without its seed: trials of one key differ only in train.seed."""
        parts = [f"{k}={v}" for k, v in sorted(self.overrides.items()) if k != "train.seed"]
        return (self.arm + ": " if self.arm else "") + (" ".join(parts) or "(base)")


@dataclass
class Group:
    key: str
    overrides: dict[str, str]
    taus: list[float]
    seeds: list[str]
    run_ids: list[str]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.taus)

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1); nan for a single seed."""
        return statistics.stdev(self.taus) if len(self.taus) > 1 else math.nan


def trial_overrides(params: dict) -> dict:
    """{section.field: value} of a trial's Tune params: the sampled overrides, its ablation arm's, its seed."""
    overrides = dict(params.get("overrides") or {})
    if params.get("arm"):
        overrides.update(params["arms"][params["arm"]])
    if params.get("seed") is not None:
        overrides["train.seed"] = params["seed"]
    return overrides


def records_from_grid(grid, stage: str, metric: str, max_steps: int) -> list[TrialRecord]:
    out = []
    for r in grid:
        m = r.metrics or {}
        params = r.config or {}
        overrides = {k: str(v) for k, v in trial_overrides(params).items()}
        step = int(m.get("step", 0) or 0)
        status = "error" if r.error is not None else ("completed" if step >= max_steps else "stopped")
        tau = m.get(metric)
        out.append(TrialRecord(
            trial_id=str(m.get("trial_id") or params.get("trial_id") or Path(r.path).name), stage=stage,
            overrides=overrides, tau=float(tau) if tau is not None else None, step=step, status=status,
            run_id=m.get("mlflow_run_id"), trial_dir=m.get("trial_dir"), arm=params.get("arm") or "",
            metrics={k: float(v) for k, v in m.items() if k.startswith("val_") and isinstance(v, (int, float))}))
    return out


def group_over_seeds(records: list[TrialRecord]) -> list[Group]:
    """Completed trials with a τ, grouped by config (seed excluded), best mean first."""
    groups: dict[str, Group] = {}
    for r in records:
        if r.tau is None or r.status != "completed":
            continue
        g = groups.setdefault(r.group_key(), Group(r.group_key(), {k: v for k, v in r.overrides.items()
                                                                  if k != "train.seed"}, [], [], []))
        g.taus.append(r.tau)
        g.seeds.append(r.overrides.get("train.seed", "-"))
        g.run_ids.append(r.run_id or "")
    return sorted(groups.values(), key=lambda g: -g.mean)


def ranked(records: list[TrialRecord]) -> list[TrialRecord]:
    """Trials best first: completed before early-stopped, then by τ."""
    with_tau = [r for r in records if r.tau is not None]
    return sorted(with_tau, key=lambda r: (r.status != "completed", -r.tau))


def fmt(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def trials_table(records: list[TrialRecord], keys: list[str], metric: str) -> str:
    head = ["trial", *keys, "steps", metric, "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ranked(records) + [r for r in records if r.tau is None]:
        lines.append("| " + " | ".join([r.trial_id, *(r.overrides.get(k, "") for k in keys), str(r.step),
                                         fmt(r.tau), r.status]) + " |")
    return "\n".join(lines)


def groups_table(groups: list[Group], metric: str) -> str:
    lines = [f"| config | {metric} mean ± sample std | n | seeds | per seed |", "|---|---|---|---|---|"]
    for g in groups:
        per = ", ".join(f"{t:.4f}" for t in g.taus)
        lines.append(f"| {g.key} | {g.mean:.4f} ± {fmt(g.std)} | {len(g.taus)} | {','.join(g.seeds)} | {per} |")
    return "\n".join(lines)


def tau_figure(records: list[TrialRecord], groups: list[Group], keys: list[str], metric: str, path: Path) -> Path:
    """τ against each swept key: every trial a dot (early-stopped hollow), seed groups as mean ± std bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(4 * max(1, len(keys)), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        values = sorted({r.overrides.get(key, "") for r in records} | {g.overrides.get(key, "") for g in groups})
        numeric = all(_is_number(v) for v in values)
        pos = (lambda v: float(v)) if numeric else (lambda v: float(values.index(v)))
        for r in records:
            if r.tau is None or r.stage == "s2":
                continue
            ax.scatter([pos(r.overrides.get(key, ""))], [r.tau], s=24, edgecolors="C0",
                       facecolors="C0" if r.status == "completed" else "none")
        for g in groups:
            if len(g.taus) > 1:
                ax.errorbar([pos(g.overrides.get(key, ""))], [g.mean], yerr=[g.std],
                            fmt="s", color="C3", capsize=3)
        if not numeric:
            ax.set_xticks(range(len(values)), values, rotation=20)
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def write_results(records: list[TrialRecord], path: Path) -> Path:
    path.write_text(json.dumps([asdict(r) for r in records], indent=2))
    return path
