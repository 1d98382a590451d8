"""A sweep over a corpus its objective cannot be measured on stops before Ray or MLflow start, naming the
corpus, the count and the fix (it used to train a whole trial, then fail inside Ray Tune)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr.config import load_config
from lilicorr.platform.train.shards import synthetic_rows, write_shards

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_ray_running():
    """An earlier module's Ray instance (the suite runs in one process) would hide whether the check started Ray:
    start from none."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _cfg(tmp_path, data):
    return load_config("tiny-random", [f"data.output_dir={data}", f"sweep.output_dir={tmp_path / 'sweep'}",
                                       f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}",
                                       "sweep.num_samples=1", "train.max_steps=2"])


def _unscorable(rows):
    """Rows whose supervised tokens never come two in a row: no position can anchor a block."""
    return [{**r, "loss_mask": [i % 2 for i in range(len(r["loss_mask"]))]} for r in rows]


def _run_sweep_expecting(cfg, tmp_path, *needles):
    from lilicorr.platform.sweep.preflight import CorpusError
    from lilicorr.platform.sweep.runner import run_sweep

    with pytest.raises(CorpusError) as err:
        run_sweep(cfg)
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized(), "the check ran after Ray started"
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "sweep").exists(), "MLflow/Tune state written"
    return str(err.value)


def test_missing_training_shards_fail_first(tmp_path):
    data = tmp_path / "nothing-here"
    _run_sweep_expecting(_cfg(tmp_path, data), tmp_path, "no training shards", str(data), "jobs/regenerate.py")


def test_no_heldout_rows_fail_first_with_the_fix(tmp_path):
    data = tmp_path / "data"
    write_shards(synthetic_rows(12, 49152, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=8)
    msg = _run_sweep_expecting(_cfg(tmp_path, data), tmp_path, str(data), "0 held-out rows",
                               "val_sim_acceptance_length", "data.heldout_fraction", "data.limit")
    assert "heldout_fraction (now 0.05)" in msg


def test_heldout_rows_validation_cannot_score_fail_first(tmp_path):
    data = tmp_path / "data"
    write_shards(synthetic_rows(12, 49152, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=8)
    write_shards(_unscorable(synthetic_rows(2, 49152, 24, 60, seed=2, prefix="ho")), data, "heldout", rows_per_shard=4)
    _run_sweep_expecting(_cfg(tmp_path, data), tmp_path, str(data), "none of the 2 held-out rows",
                         "train.seq_len=", "data.heldout_fraction")


def test_a_scorable_corpus_passes_and_counts_the_rows_validation_scores(tmp_path):
    from lilicorr.platform.sweep.preflight import require_validation_corpus, scorable_heldout_rows

    data = tmp_path / "data"
    write_shards(synthetic_rows(12, 49152, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=8)
    held = synthetic_rows(3, 49152, 24, 60, seed=2, prefix="ho") + _unscorable(synthetic_rows(2, 49152, 24, 60, seed=3,
                                                                                           prefix="bad"))
    write_shards(held, data, "heldout", rows_per_shard=8)
    cfg = _cfg(tmp_path, data)
    assert scorable_heldout_rows(cfg) == (5, 3)
    assert require_validation_corpus(cfg) == 3


def test_sweep_job_prints_the_message_and_exits_2_without_starting_ray(tmp_path):
    data = tmp_path / "data"
    write_shards(synthetic_rows(12, 49152, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=8)
    out = subprocess.run([sys.executable, str(REPO / "jobs/sweep.py"), "--preset", "tiny-random",
                          f"data.output_dir={data}", f"sweep.output_dir={tmp_path / 'sweep'}",
                          f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "RAY_ADDRESS": ""})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "sweep.py: error: sweep: its objective val_sim_acceptance_length" in out.stderr
    assert "0 held-out rows" in out.stderr and "Traceback" not in out.stderr
    assert "Ray" not in out.stderr, out.stderr[-2000:]
