"""Learning curves: validation τ (simulated acceptance on held-out rows) against training tokens, from MLflow.

One training run's curve is logged as its `learning_curve.png` when it ends (train/driver.py); several runs side by
side, the comparison issue 38 asks for (same start, data and validation rows, one lever changed), come from

    python jobs/report.py --curves "DFlash=RUN_ID,LiLiCorr=RUN_ID" --out outputs/curves

which writes curves.png and curves.csv (label, step, training tokens, validation τ, validation loss). A run that
starts from an export validates at step 0 (train/worker.py), so each curve begins at its starting point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAU, LOSS, TOKENS = "val_sim_acceptance_length", "val_loss", "train_tokens"


@dataclass
class CurvePoint:
    step: int
    tokens: float  # training tokens this run had read by the step (0 at a step-0 validation)
    tau: float
    loss: float


def read_curve(client, run_id: str) -> list[CurvePoint]:
    """A run's validation points in step order (steps where validation τ and training tokens were both logged)."""
    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    tau, loss, tokens = history(TAU), history(LOSS), history(TOKENS)
    return [CurvePoint(s, tokens[s], tau[s], loss.get(s, float("nan"))) for s in sorted(tau) if s in tokens]


def plot_curves(curves: dict[str, list[CurvePoint]], title: str):
    """One line per labelled run: validation τ against training tokens (a matplotlib Figure, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6) if len(curves) > 1 else (5, 3.2))
    for label, points in curves.items():
        ax.plot([p.tokens for p in points], [p.tau for p in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation τ (simulated)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curves_csv(curves: dict[str, list[CurvePoint]]) -> str:
    lines = ["label,step,train_tokens,val_tau,val_loss"]
    lines += [f"{label},{p.step},{p.tokens:.0f},{p.tau:.4f},{p.loss:.4f}" for label, points in curves.items()
              for p in points]
    return "\n".join(lines) + "\n"


def parse_runs(spec: str) -> dict[str, str]:
    """"label=RUN_ID,label=RUN_ID" (or bare RUN_IDs, labelled by themselves) -> {label: run_id}."""
    out: dict[str, str] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        label, sep, run_id = item.rpartition("=")
        label = label if sep else run_id
        if not run_id or label in out or not (sep or re.fullmatch(r"[0-9a-f]{32}", run_id)):
            raise ValueError(f"--curves: {item!r} must be LABEL=RUN_ID (or a bare run id) with a label of its own; "
                             f"labels cannot hold commas")
        out[label] = run_id
    if not out:
        raise ValueError("--curves needs at least one LABEL=RUN_ID")
    return out
