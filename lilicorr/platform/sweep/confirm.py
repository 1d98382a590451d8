"""Confirm the sweep's top configs with engine-measured τ (`lilicorr.platform.evaluate`, as jobs/evaluate.py):
the best trial of each top config decodes held-out benchmark prompts with the speculative engine, and the
evaluation runs nest under the sweep's parent run. Validation τ is simulated; this is the measured one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from lilicorr.config import Config
from lilicorr.platform.sweep.results import TrialRecord, group_over_seeds


def _evaluate_under(parent_run_id: str, cfg: Config, args):
    """evaluate(cfg, args) with its run nested under the sweep's parent run."""
    from lilicorr.platform.evaluate.run import evaluate
    from lilicorr.platform.tracking import PARENT_ENV

    previous = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = parent_run_id
    try:
        return evaluate(cfg, args)
    finally:
        if previous is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = previous


def confirm_decode_rule(cfg: Config, parent_run_id: str, export: str, num_prompts: Optional[int] = None) -> None:
    """Table 12 measured by the engine: one export decoded as lilicorr (greedy walk) and lilicorr-viterbi."""
    from lilicorr.platform.evaluate.run import EvalArgs

    _evaluate_under(parent_run_id, cfg, EvalArgs(
        systems=["lilicorr", "lilicorr-viterbi"], benchmarks=list(cfg.eval.benchmarks), num_prompts=num_prompts,
        checkpoint=str(export)))  # one export serves both systems


def confirm_top(cfg: Config, parent_run_id: str, records: list[TrialRecord], top: int,
                num_prompts: Optional[int] = None) -> str:
    """Markdown table: config | validation τ (mean ± std over seeds) | engine τ per benchmark; logged to the parent."""
    from lilicorr.platform.evaluate.run import EvalArgs
    from lilicorr.platform.sweep.results import fmt
    from lilicorr.platform.sweep.runs import _client

    benchmarks = list(cfg.eval.benchmarks)
    rows = [f"| config | {cfg.sweep.metric} (mean ± std, n) | " + " | ".join(f"engine τ {b}" for b in benchmarks) + " |",
            "|---|---|" + "---|" * len(benchmarks)]
    for g in group_over_seeds(records)[:top]:
        trials = [r for r in records if r.run_id in g.run_ids and r.trial_dir and (Path(r.trial_dir) / "export").is_dir()]
        taus = ["no export"] * len(benchmarks)
        if trials:  # the group's best trial decodes with the engine
            export = Path(max(trials, key=lambda r: r.tau).trial_dir) / "export"
            out = _evaluate_under(parent_run_id, cfg, EvalArgs(systems=["lilicorr"], benchmarks=benchmarks,
                                                               num_prompts=num_prompts, checkpoint=str(export)))
            tau = {r["cell"]["benchmark"]: r["metrics"].get("tau") for r in out.results
                   if r["cell"]["system"] == "lilicorr" and "metrics" in r}
            taus = [fmt(tau.get(b)) for b in benchmarks]
        rows.append(f"| {g.key} | {g.mean:.4f} ± {fmt(g.std)}, {len(g.taus)} | " + " | ".join(taus) + " |")
    table = "\n".join(rows) + "\n"
    _client(cfg).log_text(parent_run_id, table, "engine_confirmation.md")
    return table
