"""Learning curves (lilicorr/platform/train/curves.py): a run that continues an export validates it at step 0, so its
curve starts where the export stands; `jobs/report.py --curves` puts runs side by side from MLflow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lilicorr.config import load_config
from lilicorr.platform.train.curves import CurvePoint, curves_csv, parse_runs
from lilicorr.platform.train.shards import synthetic_rows, write_shards

ROOT = Path(__file__).resolve().parents[2]


def test_parse_runs_labels_and_refuses_duplicates():
    assert parse_runs("a=1, b=2") == {"a": "1", "b": "2"}
    run = "0123456789abcdef0123456789abcdef"
    assert parse_runs(f"{run},x=y=r2") == {run: run, "x=y": "r2"}  # a label may hold '='; the id is after the last
    for bad in ("", "a=1,a=2", "a=", "a label, with a comma=r3"):
        with pytest.raises(ValueError, match="--curves"):
            parse_runs(bad)


def test_curves_csv_one_line_per_point():
    text = curves_csv({"v8": [CurvePoint(0, 0, 1.5, 5.25), CurvePoint(100, 1536.0, 1.625, 5.125)]})
    assert text.splitlines() == ["label,step,train_tokens,val_tau,val_loss", "v8,0,0,1.5000,5.2500",
                                 "v8,100,1536,1.6250,5.1250"]


@pytest.mark.slow
def test_a_continued_run_starts_its_curve_at_the_export(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from lilicorr.platform.train.curves import read_curve
    from lilicorr.platform.train.driver import train
    from lilicorr.platform.train.validate import validate_export

    data = tmp_path / "data"
    vocab = load_config("tiny-random").target.vocab_size
    write_shards(synthetic_rows(12, vocab, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=6)
    write_shards(synthetic_rows(4, vocab, 24, 60, seed=2, prefix="ho"), data, "heldout", rows_per_shard=4)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    common = [f"data.output_dir={data}", "train.runner=local", "train.num_workers=1", "train.global_batch_size=4",
              "train.max_steps=2", "train.validate_every=2", "train.checkpoint_every=2", "train.precision=fp32",
              f"tracking.tracking_uri={uri}"]
    start = train(load_config("tiny-random", [*common, f"train.output_dir={tmp_path / 'a'}"]), track=False)
    cont = train(load_config("tiny-random", [*common, f"train.output_dir={tmp_path / 'b'}",
                                             f"train.init_from={start.export_dir}"]))
    points = read_curve(MlflowClient(uri), cont.mlflow_run_id)
    assert [p.step for p in points] == [0, 2]
    assert points[0].tokens == 0 and points[1].tokens > 0
    # step 0 is the starting export's own validation figure (the same rows, plan and seed)
    ref = validate_export(start.export_dir, str(data), seed=0)
    assert points[0].tau == pytest.approx(ref["sim_acceptance_length"], rel=1e-5)

    sys.path.insert(0, str(ROOT))
    from jobs import report

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    report.main(["--preset", "tiny-random", "--curves", f"continued={cont.mlflow_run_id}", "--out",
                 str(tmp_path / "curves")])
    assert (tmp_path / "curves" / "curves.png").stat().st_size > 0
    rows = (tmp_path / "curves" / "curves.csv").read_text().splitlines()
    assert rows[1].startswith("continued,0,0,") and len(rows) == 3
    with pytest.raises(SystemExit):
        report.main(["--preset", "tiny-random", "--curves", "x=no-such-run", "--out", str(tmp_path / "c2")])


def test_progress_lines_end_with_an_eta(capsys, monkeypatch):
    """The ETA is the steps left at this process's mean seconds a step so far."""
    from types import SimpleNamespace

    import torch

    from lilicorr.platform.train import progress
    from lilicorr.platform.train.progress import RankZeroLog
    from lilicorr.platform.train.schedule import StepPlan

    now = [0.0]  # start-up at 0 s, then 10 s a step
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    log = RankZeroLog(load_config("tiny-random", ["train.log_every=1"]),
                      StepPlan(world_size=1, micro_batch=1, steps_per_epoch=100, total_steps=100, warmup_steps=0),
                      None, enabled=True)
    out = SimpleNamespace(loss=torch.tensor(1.0), terms={}, metrics={})
    for step in (1, 2, 99):
        now[0] += 10.0 if step < 99 else 970.0
        log.train_step(step, out, {"drafter": 1e-3}, 10, None)
    lines = capsys.readouterr().out.splitlines()
    assert "eta 16 min" in lines[0] and "eta 16 min" in lines[1]  # 99 and 98 steps left x 10 s
    assert "eta 10 s" in lines[2]  # the last step left
