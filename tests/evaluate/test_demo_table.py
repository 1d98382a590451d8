"""The demo's Table-5 report: speedups are each system's tok/s over AR's on the same benchmark."""

import importlib.util
import sys
from pathlib import Path

from lilicorr.platform.evaluate.tables import format_table5

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    spec = importlib.util.spec_from_file_location("demo_job", ROOT / "jobs" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_job"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_table_reports_tau_tokens_per_s_and_speedup_over_ar():
    results = {("mt-bench", "ar"): {"tau": 1.0, "tokens_per_s": 20.0},
               ("mt-bench", "dflash"): {"tau": 1.5, "tokens_per_s": 25.0},
               ("mt-bench", "lilicorr"): {"tau": 1.75, "tokens_per_s": 30.0}}
    table = format_table5(results, ["mt-bench"], ["ar", "dflash", "lilicorr"])
    row = [line for line in table.splitlines() if line.startswith("mt-bench")][0]
    assert "– / 20.0 / 1.00x" in row
    assert "1.50 / 25.0 / 1.25x" in row
    assert "1.75 / 30.0 / 1.50x" in row


def test_default_demo_plan_continues_the_shipped_drafter_within_a_ten_minute_budget(tmp_path):
    from lilicorr.config import load_config

    demo = _demo()
    cfg = load_config("smollm2-135m")
    assert cfg.demo.budget == 0.25  # `make demo` with no ARGS: the ten-minute run
    plan = demo.plan_demo(cfg, tmp_path)
    assert (plan.limit, plan.steps, plan.prompts, plan.max_new_tokens) == (24, 8, 3, 64)
    assert plan.init_from == str(ROOT / "checkpoints" / "smollm2-135m" / "dflash")
    # both heads get the same overrides (only --head differs): the same start, data, steps and seed
    assert f"train.init_from={plan.init_from}" in plan.train and "train.max_steps=8" in plan.train
    assert "drafter.draft_vocab=0" in plan.train  # the shipped export's own (full) vocabulary
    assert "data.heldout_fraction=0.2" in plan.regenerate  # validation gets rows to score
    longer = demo.plan_demo(load_config("smollm2-135m", ["demo.budget=1"]), tmp_path)
    assert longer.limit > plan.limit and longer.steps > plan.steps and longer.max_new_tokens == 128


def test_table_carries_the_shipped_drafters_as_labelled_columns():
    results = {("mt-bench", "ar"): {"tokens_per_s": 20.0}, ("mt-bench", "dflash@shipped"): {"tau": 1.3, "tokens_per_s": 10.0}}
    table = format_table5(results, ["mt-bench"], ["ar", "dflash@shipped"])
    assert "dflash@shipped" in table.splitlines()[0] and "1.30 / 10.0 / 0.50x" in table
