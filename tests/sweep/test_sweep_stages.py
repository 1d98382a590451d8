"""The sweep's Tune machinery with a stand-in trial whose τ is known in advance (no training): grid search,
ASHA stopping the weaker trials at the first rung, stage two re-running the best config over the other seeds,
mean ± sample std, the best config file and tags; and an ablation's arms x seeds with its Δ verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from lilicorr.config import load_config

pytestmark = pytest.mark.slow

METRIC = "val_sim_acceptance_length"


def fake_trial(params, base, stage, sweep_dir, sweep, parent_run_id):
    """Final τ = 1 + γ + 0.01 * seed, reached linearly over 8 steps, reported every 2 steps."""
    import ray.tune

    from lilicorr.platform.sweep.runs import finish_child_run, open_child_run
    from lilicorr.platform.sweep.trial import trial_config

    cfg, _ = trial_config(base, params)
    tid = ray.tune.get_context().get_trial_id()
    d = Path(sweep_dir) / "trials" / f"{stage}-{tid}"
    d.mkdir(parents=True, exist_ok=True)
    run_id = open_child_run(cfg, parent_run_id, d, f"{stage}-{tid}", {"stage": stage})
    final = 1.0 + cfg.loss.gamma + 0.01 * cfg.train.seed
    for step in (2, 4, 6, 8):
        ray.tune.report({"step": step, METRIC: final * step / 8, "mlflow_run_id": run_id, "trial_dir": str(d)})
    finish_child_run(cfg, run_id, "FINISHED")


@pytest.fixture(scope="module")
def local_ray(local_ray_2cpu):
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _cfg(tmp_path, *overrides):
    return load_config("tiny-random", [f"sweep.output_dir={tmp_path / 'sweeps'}", "train.max_steps=8",
                                       f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}", *overrides])


def test_grid_asha_and_stage_two(tmp_path, local_ray):
    import mlflow

    from lilicorr.platform.sweep.runner import run_sweep

    cfg = _cfg(tmp_path, "sweep.search=grid", "sweep.num_samples=1", "sweep.space=loss.gamma=0.4|0.3|0.2", "sweep.scheduler=asha",
               "sweep.grace_period=2", "sweep.reduction_factor=2", "sweep.seeds=[0,1,2]", "sweep.top_k=1")
    out = run_sweep(cfg, trainable=fake_trial)

    s1 = {r.overrides["loss.gamma"]: r for r in out.records if r.stage == "s1"}
    # Trials run in grid order; each later (weaker) one is below the first's τ at the step-2 rung and stops there.
    assert s1["0.4"].status == "completed" and s1["0.4"].tau == pytest.approx(1.4)
    assert [(s1[g].status, s1[g].step) for g in ("0.3", "0.2")] == [("stopped", 2), ("stopped", 2)]
    s2 = sorted((r.overrides["train.seed"], r.tau) for r in out.records if r.stage == "s2")
    assert s2 == [("1", pytest.approx(1.41)), ("2", pytest.approx(1.42))]  # seed 0 is stage one's trial

    client = mlflow.tracking.MlflowClient(tracking_uri=cfg.tracking.tracking_uri)
    parent = client.get_run(out.parent_run_id)
    assert parent.data.metrics[f"best_{METRIC}"] == pytest.approx(1.41)
    assert parent.data.metrics[f"best_{METRIC}_std"] == pytest.approx(0.01)  # sample std of 1.40, 1.41, 1.42
    assert "1.4100 ± 0.0100 | 3 | 0,1,2" in out.table
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{out.parent_run_id}'")
    assert len(children) == 5
    assert sorted(r.info.status for r in children) == ["FINISHED"] * 3 + ["KILLED"] * 2
    best = [r for r in children if r.data.tags.get("best") == "true"]
    assert [r.info.run_id for r in best] == [out.best_run_id]
    assert best[0].data.params["train.seed"] == "2"  # the best trial of the best config
    text = Path(out.best_config).read_text()
    assert "loss.gamma: 0.4" in text and "train.seed: 0" in text and "sweep." not in text.split("# preset")[1]


def test_distractor_ablation(tmp_path, local_ray):
    from lilicorr.platform.sweep.ablations import run_ablation

    cfg = _cfg(tmp_path, "loss.gamma=0.25", "loss.lam=1.0", "sweep.seeds=[0,1]")
    out = run_ablation(cfg, "distractor", trainable=fake_trial)
    taus = sorted((r.arm, r.overrides["train.seed"], r.tau) for r in out.records)
    assert taus == [("full", "0", pytest.approx(1.25)), ("full", "1", pytest.approx(1.26)),
                    ("no-distractor", "0", pytest.approx(1.5)), ("no-distractor", "1", pytest.approx(1.51))]
    # Δ = 0.25; each arm's std 0.00707 over 2 seeds -> standard error 0.00707: measurable.
    assert "= +0.2500 (+19.92%), standard error 0.0071 over 2/2 seeds: measurable" in out.table
