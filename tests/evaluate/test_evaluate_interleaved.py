"""An evaluation setting decodes its systems interleaved (evaluate/cells.py): every system sees every
prompt, AR's outputs are the speculative systems' (lossless), the speedup is the ratio of pooled tokens/s
with an interval around it, and the interval helpers pool as the tables do (hand-computed values)."""

import numpy as np
import pytest

from lilicorr.platform.evaluate.cells import run_setting, units
from lilicorr.platform.evaluate.plan import Cell
from lilicorr.platform.intervals import interval, speed_ratio


def test_speed_ratio_pools_units_before_dividing():
    rows = np.array([[10, 1.0, 10, 2.0],  # A: 30 tokens in 4 s; B: 30 tokens in 6 s
                     [20, 3.0, 20, 4.0]])
    assert speed_ratio(rows) == pytest.approx((30 / 4) / (30 / 6))


def test_interval_brackets_the_pooled_value_and_is_degenerate_for_identical_units():
    rows = np.array([[10, 1.0, 10, 2.0]] * 5)
    lo, hi = interval(rows, speed_ratio, np.random.default_rng(0))
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def test_units_are_single_prompts_at_batch_1_and_the_whole_set_above():
    assert units(3, 1) == [[0], [1], [2]]
    assert units(3, 4) == [[0, 1, 2]]


def test_a_setting_interleaves_its_systems_and_measures_the_speedup_beside_ar(one_torch_thread):
    from lilicorr.config import load_config
    from lilicorr.platform.assets import load_target

    cfg = load_config("tiny-random", ["engine.max_new_tokens=6"])
    model, _ = load_target(cfg.target)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    cells = [Cell(s, "toy", 0.0, 0, 1) for s in ("ar", "dflash", "hf")]
    res = run_setting(cfg, model, cells, prompts, {}, stop_ids=[], repeats=2)
    by = {r["cell"].system: r for r in res}
    assert [r["cell"] for r in res] == cells and not any("error" in r for r in res)
    assert by["dflash"]["outputs"] == by["ar"]["outputs"] == by["hf"]["outputs"]  # greedy: lossless, same target
    for r in res:
        m = r["metrics"]
        assert m["rounds"] == 2 and m["prompts"] == 3 and m["generated_tokens"] == 18
        assert m["speedup"] == pytest.approx(m["tokens_per_s"] / by["ar"]["metrics"]["tokens_per_s"])
    d = by["dflash"]["metrics"]
    assert d["speedup_lo"] <= d["speedup"] <= d["speedup_hi"] and d["tau_lo"] <= d["tau"] <= d["tau_hi"]
    assert by["ar"]["metrics"]["speedup"] == 1.0 and "speedup_lo" not in by["ar"]["metrics"]
    # which implementation ran (engine/backend.py): each engine cell's MLflow params backend.*; not the peer's
    assert by["dflash"]["backend"]["drafter"] == "scripted float32" and by["ar"]["backend"]["head"] == "none"
    assert "backend" not in by["hf"]


def test_a_system_that_cannot_build_is_reported_and_the_others_run(one_torch_thread):
    from lilicorr.config import load_config
    from lilicorr.platform.assets import load_target

    cfg = load_config("tiny-random", ["engine.max_new_tokens=3"])
    model, _ = load_target(cfg.target)
    cells = [Cell("ar", "toy", 0.0, 0, 1), Cell("lilicorr", "toy", 0.0, 0, 1)]
    res = run_setting(cfg, model, cells, [[5, 6, 7]], {"lilicorr": "/nonexistent/export"}, stop_ids=[])
    assert "error" in res[1] and "metrics" in res[0] and res[0]["metrics"]["generated_tokens"] == 3
