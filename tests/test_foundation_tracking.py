"""MLflow helper: a real sqlite store; params = resolved config; tags = commit, preset, job."""

import mlflow

from lilicorr.config import load_config
from lilicorr.platform.tracking import start_run


def test_run_records_config_params_and_tags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config("tiny-random", ["head.top_k=5"])
    with start_run(cfg, "unit-test") as run:
        mlflow.log_metric("loss", 0.5, step=1)
    assert (tmp_path / "mlruns.db").exists()
    got = mlflow.MlflowClient().get_run(run.info.run_id)
    assert got.data.params["head.top_k"] == "5"
    assert got.data.params["preset"] == "tiny-random"
    assert got.data.tags["job"] == "unit-test" and got.data.tags["preset"] == "tiny-random"
    assert len(got.data.tags["git_commit"]) in (7, 40) or got.data.tags["git_commit"] == "unknown"
    assert got.data.metrics["loss"] == 0.5
    assert "config.json" in [a.path for a in mlflow.artifacts.list_artifacts(run_id=run.info.run_id)]


def test_env_uri_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/other.db")
    with start_run(load_config("tiny-random"), "unit-test"):
        pass
    assert (tmp_path / "other.db").exists() and not (tmp_path / "mlruns.db").exists()
