"""Rank 0's view of training: a progress line every `train.log_every` steps and MLflow metrics.

Workers log into the MLflow run the driver opened (its id and an absolute tracking URI travel in the loop
config), through `MlflowClient` so no worker touches the global active-run state.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from lilicorr.config import Config
from lilicorr.platform.train.schedule import StepPlan

# Train-time metrics worth a curve (JointModel returns more; all go to MLflow, these also to stdout).
SHOWN_TERMS = ("dflash", "ce", "dist", "margin")


class RankZeroLog:
    def __init__(self, cfg: Config, plan: StepPlan, mlflow_info: Optional[dict], enabled: bool):
        self.enabled = enabled
        self.every = max(1, cfg.train.log_every)
        self.plan = plan
        self.last_train: dict[str, float] = {}
        self._tokens = 0
        self._since = self._t0 = time.perf_counter()
        self._first: Optional[tuple[int, float]] = None  # (step, time) of this process's first step: the ETA's rate
        self._client = None
        self._run_id = None
        if enabled and mlflow_info:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=mlflow_info["tracking_uri"])
            self._run_id = mlflow_info["run_id"]

    def line(self, text: str) -> None:
        if self.enabled:
            # Written to the stream, not print(): Ray Train V2 patches print() in workers and, once a
            # library has wrapped sys.stdout, emits every printed line twice.
            sys.stdout.write(f"[train] {text} ({time.perf_counter() - self._t0:.0f} s)\n")
            sys.stdout.flush()

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 900):  # log_batch takes at most 1000 metrics
            self._client.log_batch(self._run_id, metrics=items[i:i + 900])

    def train_step(self, step: int, out, lrs: dict[str, float], tokens: int, norm: Optional[float]) -> None:
        """Record one optimizer step (`lrs`: each parameter group's LR by name; `tokens`: real tokens over all
        workers, estimated from this rank)."""
        if not self.enabled:
            return
        self._tokens += tokens
        if self._first is None:
            self._first = (step - 1, self._since)  # the step began where the previous one ended (or at start-up)
        if step % self.every != 0 and step != self.plan.total_steps:
            return
        elapsed = max(time.perf_counter() - self._since, 1e-9)
        metrics = {"loss": float(out.loss.detach()), **{f"loss_{k}": float(v) for k, v in out.terms.items()},
                   **{k: float(v) for k, v in out.metrics.items()}, "tokens_per_s": self._tokens / elapsed}
        metrics.update({f"lr_{name}": lr for name, lr in lrs.items()})
        if norm is not None:
            metrics["grad_norm"] = norm
        self.last_train = metrics
        self._log_metrics(metrics, step)
        terms = " ".join(f"{k} {float(out.terms[k]):.4f}" for k in SHOWN_TERMS if k in out.terms)
        lr_text = "/".join(f"{lr:.2e}" for lr in lrs.values())
        self.line(f"step {step}/{self.plan.total_steps} loss {metrics['loss']:.4f} {terms} lr {lr_text} "
                  f"acc {out.metrics.get('per_slot_accuracy', float('nan')):.3f} "
                  f"tok/s {metrics['tokens_per_s']:.0f} eta {self._eta(step)}")
        self._tokens = 0
        self._since = time.perf_counter()

    def _eta(self, step: int) -> str:
        """Time left at this process's mean seconds a step so far (validations and checkpoints included)."""
        first_step, first_t = self._first
        left = (time.perf_counter() - first_t) / max(1, step - first_step) * (self.plan.total_steps - step)
        return f"{left / 60:.0f} min" if left >= 90 else f"{left:.0f} s"

    def resumed(self, step: int) -> None:
        """A restarted worker group picked up the checkpoint taken at `step` (a curve of restarts)."""
        if self.enabled:
            self._log_metrics({"resumed_from_step": float(step)}, step)

    def validation(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._log_metrics(metrics, step)
        shown = ("val_loss", "val_sim_acceptance_length", "val_oracle_prefix_coverage", "val_per_slot_accuracy")
        self.line(f"validation at step {step}: " + " ".join(f"{k[4:]} {metrics[k]:.4f}" for k in shown if k in metrics))
