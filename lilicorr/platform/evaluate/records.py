"""Evaluation cells read back from MLflow: one record per finished `evaluate-cell` run.

A record: {"run_id", "system", "benchmark", "temperature", "seed", "concurrency", "objective",
"metrics": {...}}. `--run-id` selects the cells under that run (an evaluation, or a pipeline run such
as the demo whose children are evaluations); `--experiment` every cell in the experiment. A cell run
twice (same system, benchmark and setting) counts once: the newest run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from lilicorr.platform.tracking import PARENT_TAG

CELL_JOB = "evaluate-cell"


@dataclass
class Records:
    records: list[dict]
    experiment_id: str
    skipped: dict[str, str] = field(default_factory=dict)  # from the evaluations' `skipped.*` tags


def _objective(params: dict) -> str:
    keys = ("gamma", "lam", "mu")
    if not any(f"export.loss.{k}" in params for k in keys):
        return "random drafter"
    return ", ".join(f"{k}={params.get(f'export.loss.{k}', '?')}" for k in keys)


def _record(run) -> dict:
    p = run.data.params
    return {"run_id": run.info.run_id, "parent": run.data.tags.get(PARENT_TAG), "system": p["system"],
            "benchmark": p["benchmark"], "temperature": float(p["temperature"]), "seed": int(p["seed"]),
            "concurrency": int(p["concurrency"]), "objective": _objective(p), "metrics": dict(run.data.metrics),
            "start_time": run.info.start_time}


def _children(client, experiment_id: str, parents: list[str]) -> list:
    return [r for pid in parents
            for r in client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = '{pid}'", max_results=5000)]


def load_records(client, experiment: Optional[str] = None, run_id: Optional[str] = None) -> Records:
    if (experiment is None) == (run_id is None):
        raise ValueError("give exactly one of experiment or run_id")
    if run_id:
        exp_id = client.get_run(run_id).info.experiment_id
        runs, frontier = [], [run_id]
        for _ in range(3):  # the run's cells, or its evaluations' cells (a pipeline parent), two levels down
            kids = _children(client, exp_id, frontier)
            runs += kids
            frontier = [k.info.run_id for k in kids if k.data.tags.get("job") != CELL_JOB]
            if not frontier:
                break
    else:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no MLflow experiment named {experiment!r} at {client.tracking_uri}")
        exp_id = exp.experiment_id
        runs = client.search_runs([exp_id], f"tags.job = '{CELL_JOB}'", max_results=5000)
    cells = [r for r in runs if r.data.tags.get("job") == CELL_JOB and r.info.status == "FINISHED"]
    newest: dict[tuple, dict] = {}
    for r in cells:
        rec = _record(r)
        key = (rec["system"], rec["benchmark"], rec["temperature"], rec["seed"], rec["concurrency"], rec["objective"])
        if key not in newest or rec["start_time"] > newest[key]["start_time"]:
            newest[key] = rec
    evaluations = sorted({r["parent"] for r in newest.values() if r["parent"]})  # parent runs of the cells
    skipped = {k.removeprefix("skipped."): v for pid in evaluations
               for k, v in client.get_run(pid).data.tags.items() if k.startswith("skipped.")}
    return Records(records=list(newest.values()), experiment_id=exp_id, skipped=skipped)
