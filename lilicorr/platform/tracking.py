"""MLflow tracking: one helper every job uses.

Default store: `sqlite:///mlruns.db` plus artifacts in `mlartifacts/`, both in the working directory;
`MLFLOW_TRACKING_URI` (or `tracking.tracking_uri`) points elsewhere, e.g. a team server. Every run
records the resolved config as params and tags the git commit, preset and job name.

    with start_run(cfg, "train") as run:
        mlflow.log_metric("loss", 1.0, step=0)
    print(run.info.run_id)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

from lilicorr.config import Config

DEFAULT_URI = "sqlite:///mlruns.db"
DEFAULT_ARTIFACTS = "mlartifacts"


def tracking_uri(cfg: Config | None = None) -> str:
    if cfg is not None and cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI)


def git_commit() -> str:
    """The commit of the code being run ('unknown' outside a checkout, e.g. a Ray working_dir copy)."""
    if os.environ.get("LILICORR_GIT_COMMIT"):
        return os.environ["LILICORR_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def setup(cfg: Config | None = None):
    """Point MLflow at the store and select the experiment; returns the mlflow module."""
    import mlflow

    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    name = cfg.tracking.experiment if cfg is not None else "lilicorr"
    if mlflow.get_experiment_by_name(name) is None:
        # A local sqlite store keeps artifacts beside it rather than in ./mlruns.
        location = Path(DEFAULT_ARTIFACTS).resolve().as_uri() if uri == DEFAULT_URI else None
        mlflow.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(name)
    return mlflow


def _param_value(value) -> str:
    text = str(value)
    return text if len(text) <= 500 else text[:497] + "..."  # MLflow caps param values


@contextlib.contextmanager
def start_run(cfg: Config, job: str, run_name: str | None = None, nested: bool = False,
              extra_tags: dict[str, str] | None = None) -> Iterator:
    """An MLflow run with the resolved config as params and git/preset/job tags."""
    mlflow = setup(cfg)
    tags = {"git_commit": git_commit(), "preset": cfg.preset, "job": job, **(extra_tags or {})}
    with mlflow.start_run(run_name=run_name or f"{job}-{cfg.preset}", nested=nested, tags=tags) as run:
        params = {k: _param_value(v) for k, v in cfg.flat().items()}
        items = list(params.items())
        for i in range(0, len(items), 100):  # log_params takes at most 100 per call
            mlflow.log_params(dict(items[i:i + 100]))
        mlflow.log_text(cfg.to_json(), "config.json")
        yield run


def run_location(run) -> str:
    """Human-readable pointer to a run: the store URI and the run id."""
    import mlflow

    return f"run {run.info.run_id} in experiment {run.info.experiment_id} at {mlflow.get_tracking_uri()}"
