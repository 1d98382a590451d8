"""An evaluation whose export was trained on another target stops before Ray, MLflow or the target load,
naming the system, the export, what differs and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    import torch

    from lilicorr.models.joint import JointModel
    from lilicorr.models.target import build_random_target

    cfg = load_config("tiny-random", ["head.kind=none"])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target)).export(tmp_path_factory.mktemp("ex") / "dflash")


def test_matching_export_passes_and_another_shape_or_source_is_named(tiny_export):
    from lilicorr.platform.evaluate.preflight import ExportMismatch, require_exports_match_target

    require_exports_match_target(load_config("tiny-random"), {"ar": None, "dflash": str(tiny_export)})
    with pytest.raises(ExportMismatch) as err:
        require_exports_match_target(load_config("tiny-random", ["target.num_layers=6"]), {"dflash": str(tiny_export)})
    assert "system dflash" in str(err.value) and "num_layers 4 vs 6" in str(err.value)
    with pytest.raises(ExportMismatch, match=r"source 'random' vs 'embedded:smollm2-135m'.*--preset tiny-random"):
        require_exports_match_target(load_config("smollm2-135m"), {"dflash": str(tiny_export)})


def test_shipped_drafters_fail_first_on_another_target(tmp_path):
    # checkpoints/smollm2-135m/ under --preset tiny-random: exit 2 with the message, no Ray, no MLflow store.
    out = subprocess.run([sys.executable, str(REPO / "jobs/evaluate.py"), "--preset", "tiny-random",
                          "--checkpoint", str(REPO / "checkpoints/smollm2-135m/dflash"), "--systems", "ar,dflash",
                          "--benchmarks", "mt-bench", "--num-prompts", "1",
                          f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "RAY_ADDRESS": ""})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "evaluate: error: evaluate: system dflash's export" in out.stderr
    assert "source 'embedded:smollm2-135m' vs 'random'" in out.stderr and "--preset smollm2-135m" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "mlruns.db").exists()
