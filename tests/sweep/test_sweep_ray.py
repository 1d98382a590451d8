"""End to end on Ray Tune + Ray Train with tiny-random: `jobs/sweep.py --preset tiny-random sweep.num_samples=2`
is killed (SIGKILL, driver and its local Ray) once the first trial has finished, then the same command
resumes it: the finished trial is not run again, the missing one runs, and MLflow ends with one parent run
holding two child training runs, each with the validation τ metric; the best config file loads as --config."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lilicorr.platform.train.shards import synthetic_rows, write_shards

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
METRIC = "val_sim_acceptance_length"


def _trial_states(tune_dir: Path) -> dict[str, str]:
    """trial id -> status from Tune's last saved experiment state ({} before the first save)."""
    files = sorted(glob.glob(str(tune_dir / "experiment_state-*.json")))
    if not files:
        return {}
    try:
        data = json.loads(Path(files[-1]).read_text())
    except (json.JSONDecodeError, OSError):  # caught mid-write
        return {}
    states = {}
    for item in data["trial_data"]:
        trial = json.loads(item[0])
        states[trial["trial_id"]] = trial["status"]
    return states


def test_sweep_killed_then_resumed(tmp_path):
    import mlflow

    data, out, db = tmp_path / "data", tmp_path / "sweep", tmp_path / "mlruns.db"
    write_shards(synthetic_rows(16, 49152, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=8)
    write_shards(synthetic_rows(4, 49152, 24, 60, seed=2, prefix="ho"), data, "heldout", rows_per_shard=4)
    cmd = [sys.executable, str(REPO / "jobs/sweep.py"), "--preset", "tiny-random", "sweep.num_samples=2",
           f"data.output_dir={data}", f"sweep.output_dir={out}", f"tracking.tracking_uri=sqlite:///{db}",
           "train.max_steps=2", "train.validate_every=2", "train.checkpoint_every=2", "sweep.max_concurrent_trials=1",
           "sweep.name=tiny"]
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1"}
    tune_dir = out / "tiny" / "tune" / "s1"

    # First attempt: killed, with its whole process group, as soon as Tune has saved one finished trial.
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 1500  # minutes of Ray start-up on a loaded 2-core box
            while time.monotonic() < deadline and proc.poll() is None:
                if list(_trial_states(tune_dir).values()).count("TERMINATED") >= 1:
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    states = _trial_states(tune_dir)
    finished = [t for t, s in states.items() if s == "TERMINATED"]
    assert len(finished) == 1, (states, (tmp_path / "first.log").read_text()[-3000:])
    first_run_id = (out / "tiny" / "trials" / f"s1-{finished[0]}" / "mlflow_run_id").read_text().strip()
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    before = client.get_metric_history(first_run_id, METRIC)
    assert before and client.get_run(first_run_id).info.status == "FINISHED"

    # Same command again: restored, only the missing trial runs.
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1500)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming" in second.stdout
    summary = json.loads(second.stdout.strip().splitlines()[-1])

    exp = client.get_experiment_by_name("lilicorr")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_id for r in parents] == [summary["parent_run_id"]]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == summary["parent_run_id"]]
    assert len(children) == 2 and all(METRIC in r.data.metrics for r in children)
    assert all(r.info.status == "FINISHED" for r in children)
    assert all(r.data.params["train.max_steps"] == "2" and "loss.gamma" in r.data.params for r in children)
    # The finished trial was not run again: same τ history, never restarted.
    assert [(m.step, m.value) for m in client.get_metric_history(first_run_id, METRIC)] == \
        [(m.step, m.value) for m in before]
    assert "restarted" not in client.get_run(first_run_id).data.tags
    assert set(_trial_states(tune_dir).values()) == {"TERMINATED"}

    # Parent: table, figure, best tagged, best config usable by jobs/train.py --config.
    artifacts = {a.path for a in client.list_artifacts(summary["parent_run_id"])}
    assert {"sweep_table.md", "tau_vs_weights.png", "best_config.yaml", "results.json"} <= artifacts
    assert sum(r.data.tags.get("best") == "true" for r in children) == 1
    from lilicorr.cli import parse_job_args

    _, best = parse_job_args("x", argv=["--preset", "tiny-random", "--config", summary["best_config"]])
    best_child = next(r for r in children if r.data.tags.get("best") == "true")
    assert best.loss.gamma == float(best_child.data.params["loss.gamma"])
    assert best.loss.lam == float(best_child.data.params["loss.lam"])
