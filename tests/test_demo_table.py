"""The demo's Table-5 report: speedups are each system's tok/s over AR's on the same benchmark."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("demo_job", ROOT / "jobs" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_reports_tau_tokens_per_s_and_speedup_over_ar():
    demo = _demo()
    results = {("mt-bench", "ar"): {"tau": 1.0, "tokens_per_s": 20.0},
               ("mt-bench", "dflash"): {"tau": 1.5, "tokens_per_s": 25.0},
               ("mt-bench", "lilicorr"): {"tau": 1.75, "tokens_per_s": 30.0}}
    table = demo.format_table(results, ["mt-bench"])
    row = [line for line in table.splitlines() if line.startswith("mt-bench")][0]
    assert "– / 20.0 / 1.00x" in row
    assert "1.50 / 25.0 / 1.25x" in row
    assert "1.75 / 30.0 / 1.50x" in row
