"""Labelled systems (`dflash@shipped`): another export of the same system in the same evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from lilicorr.platform.evaluate.plan import build_plan
from lilicorr.platform.evaluate.tables import _order
from lilicorr.platform.evaluate.variants import add_labelled, engine_system

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "checkpoints" / "smollm2-135m"


def test_labelled_systems_get_a_cell_at_every_setting_with_their_own_export(tmp_path):
    plan = build_plan(["ar", "dflash"], ["mt-bench", "humaneval"], [0.0, 1.0], [0, 1], [1], "smollm2-135m")
    before = len(plan.cells)
    add_labelled(plan, {"dflash@shipped": str(SHIPPED / "dflash"), "lilicorr@shipped": str(SHIPPED / "lilicorr")},
                 ["mt-bench", "humaneval"])
    labelled = [c for c in plan.cells if "@" in c.system]
    # settings: T0 (first seed only) and T1 x seeds 0, 1 -> 3 per benchmark, 2 benchmarks, 2 labelled systems
    assert len(labelled) == 12 and len(plan.cells) == before + 12
    assert {c.key for c in labelled if c.system == "dflash@shipped"} == {
        c.key.replace("dflash|", "dflash@shipped|") for c in plan.cells if c.system == "dflash"}
    assert plan.checkpoints["lilicorr@shipped"] == str(SHIPPED / "lilicorr")
    assert "gamma" in plan.export_loss["lilicorr@shipped"]  # Table 11 knows what it was trained with
    assert engine_system("lilicorr@shipped") == "lilicorr" and engine_system("ar") == "ar"


def test_a_label_on_a_system_without_a_drafter_is_refused():
    plan = build_plan(["ar"], ["mt-bench"], [0.0], [0], [1], "smollm2-135m")
    for bad in ("ar@x", "dflash", "nope@x"):
        with pytest.raises(ValueError, match="SYSTEM@LABEL"):
            add_labelled(plan, {bad: str(SHIPPED / "dflash")}, ["mt-bench"])


def test_tables_put_a_labelled_system_beside_its_system():
    assert _order(["dflash@shipped", "lilicorr@shipped", "dflash", "ar", "lilicorr"]) == [
        "ar", "lilicorr", "lilicorr@shipped", "dflash", "dflash@shipped"]
