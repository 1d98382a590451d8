"""One Tune trial: a function trainable that builds and fits the Ray Train run of `train.driver.train`.

Ray 2.60 (Train V2) refuses `Tuner(trainer)`; the trial instead calls the driver's `train(cfg, ...)` and
passes a Ray Train callback that forwards each validation report to Tune (so ASHA sees τ per training
step). The trial reserves no CPU itself (`tune.with_resources(..., {"cpu": 0})`): its Train workers take
the cores. Each trial trains into its own folder `<sweep dir>/trials/<stage>-<trial id>` and logs into
its own MLflow child run of the sweep's parent run; the child run id is kept in that folder, so a trial
restarted by `Tuner.restore` continues the same child run (and Ray Train resumes its last checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lilicorr.config import Config
from lilicorr.platform.sweep.results import trial_overrides
from lilicorr.platform.sweep.runs import finish_child_run, open_child_run
from lilicorr.platform.sweep.space import apply_overrides


def make_forward_callback(metric: str, extra: dict[str, Any]):
    """A Ray Train UserCallback that forwards reports carrying `metric` to Tune, with `extra` added."""
    from ray.tune.integration.ray_train import TuneReportCallback

    class ForwardValidationToTune(TuneReportCallback):
        # Checkpoint-only reports before the first validation carry no τ: Tune's scheduler would have
        # nothing to rank, so only reports with the objective go through.
        def after_report(self, run_context, metrics, checkpoint):
            if metrics and metric in metrics[0]:
                super().after_report(run_context, [{**metrics[0], **extra}], checkpoint)

    return ForwardValidationToTune()


def trial_config(base: dict, params: dict) -> tuple[Config, dict[str, Any]]:
    """The trial's config: the base config plus the sampled `overrides` and, in stage two, the seed."""
    overrides = trial_overrides(params)
    return apply_overrides(Config.from_dict(base), overrides), overrides


def run_trial(params: dict, base: dict, stage: str, sweep_dir: str, sweep: str, parent_run_id: str) -> None:
    """Tune's function trainable. `params` (from the search): overrides, seed, arm; the rest is shared."""
    import ray.data
    import ray.tune

    from lilicorr.platform.train.driver import train

    ray.data.DataContext.get_current().enable_progress_bars = False  # one trial's logs, not bars per block

    ctx = ray.tune.get_context()
    trial_id = ctx.get_trial_id()
    cfg, overrides = trial_config(base, params)
    trial_dir = Path(sweep_dir) / "trials" / f"{stage}-{trial_id}"
    cfg.train.output_dir = str(trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    tags = {"sweep": sweep, "stage": stage, "trial_id": trial_id,
            **{f"swept.{k}": str(v) for k, v in overrides.items()}}
    if params.get("arm"):
        tags["arm"] = params["arm"]
    name = " ".join([f"train-{cfg.head.kind}-{stage}-{trial_id}", *(f"{k}={v}" for k, v in sorted(overrides.items()))])
    run_id = open_child_run(cfg, parent_run_id, trial_dir, name, tags)
    extra = {"mlflow_run_id": run_id, "trial_dir": str(trial_dir)}
    try:
        # register=False: trials do not move models:/...@newest; the sweep registers its best trial at the end.
        train(cfg, mlflow_run_id=run_id, callbacks=(make_forward_callback(cfg.sweep.metric, extra),), register=False)
    except BaseException:
        finish_child_run(cfg, run_id, "FAILED")
        raise
    finish_child_run(cfg, run_id, "FINISHED")
