"""MLflow runs of a sweep: one parent run per sweep, one child run per trial (full params, curves).

Run ids are kept in files beside the outputs (`<sweep dir>/parent_run_id`, `<trial dir>/mlflow_run_id`),
so a resumed sweep continues its parent run and a restarted trial its child run instead of opening new
ones. Children carry MLflow's `mlflow.parentRunId` tag (the UI nests them under the parent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from lilicorr.config import Config
from lilicorr.platform.tracking import PARENT_TAG, log_config, run_tags, setup, tracking_uri


def _client(cfg: Config):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(cfg))


def _existing(client, path: Path) -> Optional[str]:
    """The run id stored at `path`, if that run still exists in the store."""
    if not path.is_file():
        return None
    run_id = path.read_text().strip()
    try:
        client.get_run(run_id)
    except Exception:  # deleted run or another store
        return None
    return run_id


def _open_run(cfg: Config, id_file: Path, experiment_id: str, name: str, tags: dict, reopened: dict) -> str:
    """The run whose id `id_file` keeps, RUNNING again and tagged `reopened`; else a new one, its id kept there."""
    client = _client(cfg)
    run_id = _existing(client, id_file)
    if run_id is not None:
        client.set_terminated(run_id, "RUNNING")
        for k, v in reopened.items():
            client.set_tag(run_id, k, v)
        return run_id
    run_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
    log_config(client, run_id, cfg)
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run_id)
    return run_id


def open_parent_run(cfg: Config, name: str, sweep_dir: Path, kind: str = "sweep") -> str:
    """The sweep's parent run (created, or the one an interrupted attempt left)."""
    mlflow = setup(cfg)  # store + experiment (artifacts beside a default sqlite store)
    exp_id = mlflow.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    return _open_run(cfg, sweep_dir / "parent_run_id", exp_id, name, {**run_tags(cfg, kind), "sweep": name}, {})


def open_child_run(cfg: Config, parent_run_id: str, trial_dir: Path, run_name: str, tags: dict) -> str:
    """A trial's training run under the parent (created, or the restarted trial's own)."""
    exp_id = _client(cfg).get_run(parent_run_id).info.experiment_id
    tags = {**run_tags(cfg, "train"), PARENT_TAG: parent_run_id, "head": cfg.head.kind, **tags}
    return _open_run(cfg, trial_dir / "mlflow_run_id", exp_id, run_name, tags, {"restarted": "true"})


def finish_child_run(cfg: Config, run_id: str, status: str) -> None:
    _client(cfg).set_terminated(run_id, status)


def close_stopped_children(cfg: Config, parent_run_id: str) -> int:
    """Children still RUNNING after the sweep (ASHA killed their trial): marked KILLED + tag early_stopped."""
    client = _client(cfg)
    exp_id = client.get_run(parent_run_id).info.experiment_id
    n = 0
    for run in client.search_runs([exp_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                                  max_results=5000):
        if run.info.status == "RUNNING":
            client.set_tag(run.info.run_id, "early_stopped", "true")
            client.set_terminated(run.info.run_id, "KILLED")
            n += 1
    return n


def log_parent_results(cfg: Config, parent_run_id: str, files: dict[str, Path], metrics: dict[str, float],
                       tags: dict[str, str], table_rows: Optional[list[dict]] = None) -> None:
    client = _client(cfg)
    for path in files.values():
        client.log_artifact(parent_run_id, str(path))
    for k, v in metrics.items():
        client.log_metric(parent_run_id, k, float(v))
    for k, v in tags.items():
        client.set_tag(parent_run_id, k, v)
    if table_rows:
        client.log_text(parent_run_id, json.dumps(table_rows, indent=2, default=str), "comparison.json")
    client.set_terminated(parent_run_id, "FINISHED")
