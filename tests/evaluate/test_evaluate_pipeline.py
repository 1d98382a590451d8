"""Evaluation end to end on tiny-random through Ray: two systems x two benchmarks (one packaged, one hub
benchmark from a local file in its schema), one hub benchmark skipped offline; every cell a child run of
the evaluation; the report's numbers equal the MLflow metrics they came from."""

import csv
import json

import mlflow
import pytest

from lilicorr.config import load_config
from lilicorr.platform.evaluate.report import write_report
from lilicorr.platform.evaluate.run import EvalArgs, evaluate
from lilicorr.platform.tracking import PARENT_TAG


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory, local_ray_2cpu):
    tmp = tmp_path_factory.mktemp("eval")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlruns.db")
    mp.delenv("LILICORR_PARENT_RUN_ID", raising=False)
    gsm8k = tmp / "gsm8k.jsonl"
    gsm8k.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    cfg = load_config("tiny-random", ["engine.max_new_tokens=4", "tracking.experiment=eval-test"])
    args = EvalArgs(systems=["ar", "dflash"], benchmarks=["mt-bench", "gsm8k", "aime-2025"], num_prompts=1,
                    random_drafter=True, local_files={"gsm8k": str(gsm8k)})
    try:
        outcome = evaluate(cfg, args)
        report = write_report(str(tmp / "report"), run_id=outcome.parent_run_id)
    finally:
        mp.undo()
    return tmp, outcome, report


def test_cells_are_child_runs_of_the_evaluation(evaluation):
    tmp, outcome, _ = evaluation
    assert [r.get("error") for r in outcome.results] == [None] * 4
    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlruns.db")
    kids = client.search_runs([outcome.experiment_id], f"tags.`{PARENT_TAG}` = '{outcome.parent_run_id}'")
    assert sorted(r.info.run_name for r in kids) == sorted(
        f"eval-{s}-{b}-T0-s0-c1" for s in ("ar", "dflash") for b in ("mt-bench", "gsm8k"))
    assert all(r.info.status == "FINISHED" and r.data.metrics["generated_tokens"] == 4 for r in kids)
    # which implementation of each computation ran (engine/backend.py), a param of every engine cell
    assert {r.data.params["backend.head"] for r in kids} == {"none", "modules"}
    assert all(r.data.params["backend.target_steps"] == "scripted-stack" for r in kids)
    parent = client.get_run(outcome.parent_run_id)
    assert "hub" in parent.data.tags["skipped.benchmark:aime-2025"]


def test_report_numbers_are_the_mlflow_metrics(evaluation):
    tmp, outcome, report = evaluation
    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlruns.db")
    kids = client.search_runs([outcome.experiment_id], f"tags.`{PARENT_TAG}` = '{outcome.parent_run_id}'")
    by_cell = {(r.data.params["system"], r.data.params["benchmark"]): r.data.metrics for r in kids}
    rows = list(csv.DictReader((tmp / "report" / "table5.csv").open()))
    assert len(rows) == 4
    for row in rows:
        m = by_cell[(row["system"], row["benchmark"])]
        assert float(row["tokens_per_s"]) == pytest.approx(m["tokens_per_s"])
        assert float(row["tau"]) == pytest.approx(m["tau"])
        ar = by_cell[("ar", row["benchmark"])]["tokens_per_s"]
        assert float(row["speedup"]) == pytest.approx(m["tokens_per_s"] / ar) == pytest.approx(m["speedup"])
    cell = f"{by_cell[('dflash', 'gsm8k')]['tau']:.2f} / {by_cell[('dflash', 'gsm8k')]['tokens_per_s']:.1f} /"
    assert cell in report.markdown and "aime-2025" in report.markdown  # skipped benchmarks are reported
    assert (tmp / "report" / "tau_by_benchmark.png").stat().st_size > 1000
    logged = {a.path for a in client.list_artifacts(outcome.parent_run_id, "report")}
    assert {"report/table5.json", "report/report.md", "report/tau_by_benchmark.png"} <= logged


def test_pipeline_parent_with_stage_children(evaluation, monkeypatch):
    """The demo's pattern: open its run first (stages nest under it), then close it."""
    from lilicorr.platform.tracking import open_parent, start_run

    tmp, _, _ = evaluation
    uri = f"sqlite:///{tmp}/mlruns.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for var in ("LILICORR_PARENT_RUN_ID", "LILICORR_GIT_COMMIT"):
        monkeypatch.setenv(var, "")
    cfg = load_config("tiny-random", ["tracking.experiment=demo-test"])
    key = open_parent(cfg, "demo")
    with start_run(cfg, "regenerate") as stage:  # what a stage subprocess does with the inherited env
        pass
    with start_run(cfg, "demo", resume_key=key) as demo:
        pass
    client = mlflow.MlflowClient(uri)
    assert client.get_run(stage.info.run_id).data.tags[PARENT_TAG] == demo.info.run_id
    assert PARENT_TAG not in client.get_run(demo.info.run_id).data.tags
