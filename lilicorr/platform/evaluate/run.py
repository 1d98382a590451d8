"""The evaluation driver: plan, fan the cells out over Ray, record every cell as an MLflow child run.

    outcome = evaluate(cfg, EvalArgs(systems=["dflash", "lilicorr"], benchmarks=["mt-bench"], ...))

One parent run per evaluation (resumed when a retried evaluation with the same arguments finds it
unfinished: its finished cells are not run again). Each cell is a child run named
`eval-SYSTEM-BENCH-T..-s..-c..`, tagged with the training run of the export it used
(`lilicorr.source_run_id`), with metrics tau, tokens_per_s, speedup (over AR at the same setting, in
this evaluation), slot_acceptance.<s>, stage_ms.<stage> (--timing), and its outputs as an artifact.
Only this driver talks to MLflow (workers return results through Ray), so any store works on a cluster.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from lilicorr.config import Config
from lilicorr.platform.evaluate.benchmarks import load_benchmark
from lilicorr.platform.evaluate.plan import Cell, Plan, build_plan

CELL_TAG = "lilicorr.cell"


@dataclass
class EvalArgs:
    systems: list[str]
    benchmarks: list[str]
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    seeds: list[int] = field(default_factory=lambda: [0])
    concurrency: list[int] = field(default_factory=lambda: [1])
    num_prompts: Optional[int] = None
    checkpoint: Optional[str] = None
    random_drafter: bool = False
    timing: bool = False
    workers: int = 0  # actors (0: one per GPU on a GPU cluster, else 1)
    local_files: dict[str, str] = field(default_factory=dict)  # benchmark -> local file with the hub schema
    labelled: dict[str, str] = field(default_factory=dict)  # "SYSTEM@LABEL" -> export (evaluate/variants.py)
    repeats: Optional[int] = None  # interleaved rounds over each setting's prompts (None: eval.speed_repeats)


@dataclass
class EvalOutcome:
    parent_run_id: str
    experiment_id: str
    results: list[dict]  # one per cell: cell fields + metrics + run_id (or error)
    plan: Plan


def _log(msg: str) -> None:
    print(f"[evaluate] {msg}", file=sys.stderr, flush=True)


def _finished_cells(client, experiment_id: str, parent_id: str) -> dict[str, dict]:
    """Cells a previous attempt of this evaluation finished: key -> {"run_id", "metrics"}."""
    from lilicorr.platform.tracking import PARENT_TAG

    runs = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}' and attributes.status = 'FINISHED'")
    return {r.data.tags[CELL_TAG]: {"run_id": r.info.run_id, "metrics": dict(r.data.metrics)}
            for r in runs if CELL_TAG in r.data.tags}


def _log_cell(client, experiment_id: str, parent_id: str, cell: Cell, res: dict, plan: Plan, prompts: int,
              cfg: Config, dataset=None) -> str:
    from mlflow.entities import Metric, Param

    from lilicorr.platform.tracking import PARENT_TAG, SOURCE_RUN_TAG, run_tags

    tags = {**run_tags(cfg, "evaluate-cell"), PARENT_TAG: parent_id, CELL_TAG: cell.key, "system": cell.system,
            "benchmark": cell.benchmark}
    if cell.system in plan.source_runs:
        tags[SOURCE_RUN_TAG] = plan.source_runs[cell.system]
    run = client.create_run(experiment_id, run_name=cell.run_name(), tags=tags)
    rid = run.info.run_id
    params = {**{k: str(v) for k, v in asdict(cell).items()}, "checkpoint": str(plan.checkpoints.get(cell.system)),
              "num_prompts": str(prompts), "max_new_tokens": str(cfg.engine.max_new_tokens),
              **{f"backend.{k}": str(v)[:500] for k, v in res.get("backend", {}).items()},
              **{f"export.loss.{k}": str(v) for k, v in plan.export_loss.get(cell.system, {}).items()}}
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in res.get("metrics", {}).items()]
    client.log_batch(rid, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    if dataset is not None:  # the cell's prompts: the Dataset column of every cell row
        from lilicorr.platform.tracking_inputs import log_datasets

        log_datasets(client, rid, [(dataset, "evaluation")])
    if "outputs" in res:
        client.log_text(rid, "".join(json.dumps(o) + "\n" for o in res["outputs"]), "outputs.jsonl")
    if "error" in res:
        client.set_tag(rid, "error", res["error"][:5000])
    client.set_terminated(rid, "FAILED" if "error" in res else "FINISHED")
    return rid


def add_speedups(results: list[dict]) -> list[dict]:
    """speedup = tokens/s over AR's at the same (benchmark, T, seed, concurrency), in place, for results that
    were not measured beside AR (an interleaved setting brings its own, with its interval). Returns the results
    it gave one (their runs still lack the metric)."""
    ar = {Cell(**r["cell"]).setting: r["metrics"]["tokens_per_s"] for r in results
          if r["cell"]["system"] == "ar" and "metrics" in r}
    added = []
    for r in results:
        base = ar.get(Cell(**r["cell"]).setting)
        if "metrics" in r and base and "speedup" not in r["metrics"]:
            r["metrics"]["speedup"] = r["metrics"]["tokens_per_s"] / base
            added.append(r)
    return added


def evaluate(cfg: Config, args: EvalArgs) -> EvalOutcome:
    from mlflow import MlflowClient

    from lilicorr.platform.evaluate.workers import run_settings
    from lilicorr.platform.tracking import SOURCE_RUN_TAG, run_key, start_run
    from lilicorr.platform.tracking_inputs import benchmark_dataset

    benches, skipped = {}, {}
    for name in args.benchmarks:
        b = load_benchmark(name, args.num_prompts or cfg.eval.num_prompts, args.local_files.get(name))
        if b.skipped:
            skipped[f"benchmark:{name}"] = b.skipped
        else:
            benches[name] = b.rows
    repeats = max(1, args.repeats or cfg.eval.speed_repeats)
    plan = build_plan(args.systems, list(benches), args.temperatures, args.seeds, args.concurrency, cfg.preset,
                      args.checkpoint, args.random_drafter)
    plan.skipped.update(skipped)
    if args.labelled:
        from lilicorr.platform.evaluate.variants import add_labelled

        add_labelled(plan, args.labelled, list(benches))
    from lilicorr.platform.evaluate.preflight import require_exports_match_target

    require_exports_match_target(cfg, plan.checkpoints)  # before MLflow and Ray: a mismatch costs no target load
    for k, why in plan.skipped.items():
        _log(f"{k} skipped: {why}")
    for note in plan.notes:
        _log(note)
    key = run_key(cfg, "evaluate", json.dumps(asdict(args), sort_keys=True, default=str))
    tags = {f"{SOURCE_RUN_TAG}.{s}": r for s, r in plan.source_runs.items()}
    if len(set(plan.source_runs.values())) == 1:
        tags[SOURCE_RUN_TAG] = next(iter(plan.source_runs.values()))
    systems = list(dict.fromkeys(c.system for c in plan.cells))
    with start_run(cfg, "evaluate", name_parts=[",".join(args.benchmarks)], resume_key=key,
                   extra_tags=tags) as parent:
        import mlflow

        client = MlflowClient(mlflow.get_tracking_uri())
        exp_id, pid = parent.info.experiment_id, parent.info.run_id
        mlflow.log_dict({**plan.as_dict(), "args": asdict(args), "systems": systems}, "evaluation_plan.json")
        datasets = {name: benchmark_dataset(name, rows) for name, rows in benches.items()}
        log_eval_inputs(client, pid, datasets, plan.checkpoints)
        for k, why in plan.skipped.items():
            mlflow.set_tag(f"skipped.{k}", why[:4000])
        done = _finished_cells(client, exp_id, pid)
        results: list[dict] = []
        settings: dict[tuple, list[Cell]] = {}
        for cell in plan.cells:
            if cell.key in done:
                results.append({"cell": asdict(cell), "metrics": done[cell.key]["metrics"],
                                "run_id": done[cell.key]["run_id"], "resumed": True})
            else:
                settings.setdefault(cell.setting, []).append(cell)
        todo = {c.key for cells in settings.values() for c in cells}
        jobs = []
        for cells in settings.values():
            ar = next((c for c in plan.cells if c.system == "ar" and c.setting == cells[0].setting), None)
            if ar is not None and ar not in cells:  # finished earlier: decoded again beside them for their speedups
                cells = [ar, *cells]
            jobs.append((cells, benches[cells[0].benchmark], {c.system: plan.checkpoints.get(c.system) for c in cells}))
        _log(f"{len(plan.cells)} cells ({len(done)} already done), {len(systems)} systems x {len(benches)} benchmarks, "
             f"{len(jobs)} settings each interleaved over its systems x {repeats} round(s)")
        for res in run_settings(cfg.to_dict(), jobs, args.workers, args.timing, repeats):
            cell = Cell(**res["cell"])
            if cell.key not in todo:
                continue  # the reference AR of a resumed setting: its own cell is already recorded
            res["run_id"] = _log_cell(client, exp_id, pid, cell, res, plan, len(benches[cell.benchmark]), cfg,
                                      datasets[cell.benchmark])
            m = res.get("metrics", {})
            speed = f", {m['speedup']:.2f}x AR [{m['speedup_lo']:.2f}, {m['speedup_hi']:.2f}]" if "speedup_lo" in m else ""
            _log(f"{cell.key}: " + (res["error"] if "error" in res else
                                   f"tau {m.get('tau', float('nan')):.2f}, {m['tokens_per_s']:.1f} tok/s{speed}"))
            results.append(res)
        for r in add_speedups(results):
            client.log_metric(r["run_id"], "speedup", r["metrics"]["speedup"])
        mlflow.log_metric("cells", len(results))
        mlflow.log_metric("cells_failed", sum("error" in r for r in results))
    return EvalOutcome(parent_run_id=pid, experiment_id=exp_id, results=results, plan=plan)


def log_eval_inputs(client, run_id: str, datasets: dict[str, object], checkpoints: dict[str, Optional[str]]) -> int:
    """The prompts decoded ("evaluation") and the corpora the exports were trained on ("drafter-training")
    as the evaluation run's inputs (the UI's Dataset column and lineage). Returns how many were logged."""
    from lilicorr.platform.tracking import REPO_ROOT
    from lilicorr.platform.tracking_inputs import corpus_dataset, log_datasets

    pairs = [(ds, "evaluation") for ds in datasets.values()]
    corpora = set()
    for folder in filter(None, checkpoints.values()):
        data = json.loads((Path(folder) / "config.json").read_text()).get("config", {}).get("data", {}).get("output_dir")
        if data:  # exports record it relative to the repo (lilicorr/models/export_paths.py)
            corpora.add(str(data if Path(data).is_absolute() or "://" in data else REPO_ROOT / data))
    pairs += [(corpus_dataset(d), "drafter-training") for d in sorted(corpora)]
    return log_datasets(client, run_id, pairs)

