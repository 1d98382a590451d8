"""The main job, end to end on the embedded default (what `make demo` runs; ~10 min on 2 CPU cores).

    python jobs/demo.py [--preset smollm2-135m] [demo.budget=0.25] [section.field=value ...]

Stages, each real:
  1. regenerate  ShareGPT conversations answered by the target                     (jobs/regenerate.py)
  2. train       vanilla DFlash and LiLiCorr, both continuing from the shipped DFlash drafter for the
                 same steps, data and seed: the fair comparison, and a drafter that already drafts, so
                 a few minutes show a learning signal             (jobs/train.py --head none|lilicorr)
  3. evaluate    ONE evaluation (one target load, one AR baseline) decodes held-out MT-Bench and
                 HumanEval prompts with AR, the two trained drafters and the shipped ones
                 (`dflash@shipped`, `lilicorr@shipped`, `ddtree@shipped`: DDTree over the shipped DFlash)              (lilicorr.platform.evaluate.run)
  4. report      paper Table 5 (τ / tok/s / speedup over AR), the report's tables and figures, logged to
                 MLflow; the console ends with the table and where to look next.
`demo.budget` scales conversations, steps and prompts (0.25 is the ten-minute default; 1 is a longer run).
Every stage's run nests under the demo's MLflow run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lilicorr.cli import parse_job_args  # noqa: E402  (pure Python: bad flags fail fast)

SYSTEMS = [("ar", None), ("dflash", "none"), ("lilicorr", "lilicorr")]  # (engine system, trained head)
SHIPPED_LABEL = "shipped"  # the shipped drafters decode as `dflash@shipped`, `lilicorr@shipped`, `ddtree@shipped`


@dataclass
class DemoPlan:
    """What each stage runs at a budget (pure: tests check it without running anything)."""

    limit: int  # conversations regenerated
    steps: int  # training steps of each head
    prompts: int  # prompts per benchmark
    max_new_tokens: int  # per decoded prompt
    regenerate: list[str] = field(default_factory=list)  # overrides of each stage
    train: list[str] = field(default_factory=list)
    init_from: str | None = None  # the shipped DFlash export both heads continue from (None: from scratch)
    data_dir: str = ""  # the regenerated corpus


def plan_demo(cfg, out: Path) -> DemoPlan:
    """Budgets for `demo.budget`. At 0.25: 24 conversations, 8 steps per head, 3 prompts x 64 tokens."""
    from lilicorr.platform.shipped import shipped_checkpoint

    b = cfg.demo.budget
    plan = DemoPlan(limit=max(8, round(96 * b)), steps=max(4, round(32 * b)), prompts=max(2, round(12 * b)),
                    max_new_tokens=64 if b < 0.5 else cfg.engine.max_new_tokens)
    data = out / f"regenerated-{plan.limit}"  # per size: a corpus folder refuses another fingerprint
    plan.data_dir = str(data)
    # 20% held out: validation needs rows to score (a 5% split of 24 conversations is often empty).
    plan.regenerate = [f"data.limit={plan.limit}", f"data.output_dir={data}", "data.heldout_fraction=0.2"]
    plan.train = [f"data.output_dir={data}", f"train.max_steps={plan.steps}", "train.epochs=100",
                  f"train.validate_every={max(1, plan.steps // 2)}", f"train.checkpoint_every={plan.steps}"]
    plan.init_from = shipped_checkpoint(cfg.preset, "dflash")
    if plan.init_from:  # continue the shipped drafter as its recipe trained it (its vocabulary, LR, workers)
        shipped = json.loads((Path(plan.init_from) / "config.json").read_text())["config"]
        plan.train += [f"train.init_from={plan.init_from}",
                       f"drafter.draft_vocab={shipped['drafter']['draft_vocab']}",
                       f"optim.lr_drafter={shipped['optim']['lr_drafter']}",
                       f"train.num_workers={shipped['train']['num_workers']}"]
    return plan


def run_stage(name: str, argv: list[str], timings: dict[str, float]) -> dict:
    """Run one job; stream its output; return the JSON object on its last stdout line."""
    print(f"\n=== {name}: {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    last = ""
    for line in proc.stdout:  # stream so progress stays visible
        sys.stdout.write(line)
        if line.strip():
            last = line.strip()
    if proc.wait() != 0:
        raise SystemExit(f"demo: stage {name!r} failed with exit code {proc.returncode}")
    timings[name] = time.perf_counter() - start
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        return {}


def evaluate_all(cfg, plan: DemoPlan, checkpoints: dict[str, str], timings: dict[str, float]):
    """Stage 3: one evaluation over AR, the trained drafters and the shipped ones (labelled)."""
    from lilicorr.platform.evaluate.run import EvalArgs, evaluate
    from lilicorr.platform.shipped import shipped_checkpoint

    print("\n=== evaluate: " + ", ".join(f"{s}={c}" for s, c in checkpoints.items()), flush=True)
    start = time.perf_counter()
    labelled = {f"{s}@{SHIPPED_LABEL}": shipped_checkpoint(cfg.preset, s) for s, head in SYSTEMS if head}
    # DDTree (training-free) over the shipped DFlash drafter: the fastest system on a CPU (engine.ddtree_budget)
    labelled[f"ddtree@{SHIPPED_LABEL}"] = shipped_checkpoint(cfg.preset, "ddtree")
    labelled = {k: v for k, v in labelled.items() if v}
    cfg.engine.max_new_tokens = plan.max_new_tokens
    args = EvalArgs(systems=[s for s, _ in SYSTEMS], benchmarks=list(cfg.eval.benchmarks), num_prompts=plan.prompts,
                    checkpoint=",".join(f"{s}={c}" for s, c in checkpoints.items()), labelled=labelled)
    outcome = evaluate(cfg, args)
    timings["evaluate"] = time.perf_counter() - start
    failed = [r for r in outcome.results if "error" in r]
    if failed:
        raise SystemExit(f"demo: {len(failed)} evaluation cells failed, first: {failed[0]['error']}")
    results = {(r["cell"]["benchmark"], r["cell"]["system"]): r["metrics"] for r in outcome.results}
    systems = [s for s, _ in SYSTEMS] + list(labelled)
    return outcome, results, systems


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_job_args("LiLiCorr end-to-end demo on the embedded default", argv=argv)
    from lilicorr.platform.console import quiet_console
    quiet_console("demo", enabled=argv is None)  # console: stage lines; full log: outputs/logs/
    from lilicorr.platform.tracking import open_parent, run_location, start_run, tracking_uri, ui_link
    demo_key = open_parent(cfg, "demo")  # the demo's run, opened now: every stage below is its child run
    out = ROOT / "outputs" / "demo"
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_demo(cfg, out)
    preset = ["--preset", args.preset, *args.overrides]
    timings: dict[str, float] = {}
    print(f"demo: budget {cfg.demo.budget:g}: {plan.limit} conversations, {plan.steps} steps per head"
          + (f" from {Path(plan.init_from).relative_to(ROOT)}" if plan.init_from else " from scratch")
          + f", {plan.prompts} prompts x {plan.max_new_tokens} tokens per benchmark", flush=True)

    summaries: dict[str, dict] = {"regenerate": run_stage("regenerate", ["jobs/regenerate.py", *preset,
                                                                          *plan.regenerate], timings)}
    checkpoints: dict[str, str] = {}
    for system, head in SYSTEMS:
        if head is None:
            continue
        run_dir = out / f"train-{head}"
        summary = run_stage(f"train[{head}]", ["jobs/train.py", *preset, "--head", head, *plan.train,
                                               f"train.output_dir={run_dir}"], timings)
        summaries[f"train[{head}]"] = summary
        checkpoints[system] = summary.get("export_dir", str(run_dir / "export"))

    outcome, results, systems = evaluate_all(cfg, plan, checkpoints, timings)
    from lilicorr.platform.evaluate.report import write_report
    from lilicorr.platform.evaluate.tables import format_table5

    table = format_table5(results, list(dict.fromkeys(b for b, _ in results)), systems)
    start = time.perf_counter()
    report_dir = out / "report"
    with start_run(cfg, "demo", resume_key=demo_key) as run:  # closes the run open_parent opened
        import mlflow

        mlflow.log_metrics({f"{bench}.{system.replace('@', '.')}.{key}": float(r[key])
                            for (bench, system), r in results.items() for key in ("tau", "tokens_per_s") if key in r})
        mlflow.log_text(table, "table5.txt")
        from lilicorr.platform.tracking_inputs import log_corpus

        log_corpus(mlflow.MlflowClient(), run.info.run_id, plan.data_dir, "training")  # the Dataset column's row
        # the report reads the evaluation's cells (two levels under this run) and logs itself here
        report = write_report(str(report_dir), run_id=run.info.run_id, tracking_uri=tracking_uri(cfg))
        timings["report"] = time.perf_counter() - start
        mlflow.log_metrics({f"wall_s.{name.replace('[', '.').replace(']', '')}": s for name, s in timings.items()})
        mlflow.log_dict({"stages": summaries, "timings": timings, "evaluation": outcome.parent_run_id},
                        "summary.json")
    import ray

    ray.shutdown()
    print("\n" + report.markdown)
    print("\nStage wall times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
          + f" (total {sum(timings.values()):.0f}s)")
    print(f"\nTable 5 (τ / tok/s / speedup over AR; {plan.prompts} prompts x {plan.max_new_tokens} tokens per "
          f"benchmark, greedy, every system interleaved prompt by prompt over {cfg.eval.speed_repeats} rounds, the "
          f"speedup's 95% interval under it; @{SHIPPED_LABEL} = the drafters under checkpoints/{args.preset}/):\n"
          + table)
    print(f"\nReport: {report_dir.relative_to(ROOT)}/report.md (tables as .md/.csv, figures as .png)")
    print(f"MLflow: demo {run_location(run)}")
    mlflow_cli = os.path.relpath(Path(sys.executable).parent / "mlflow", ROOT)
    print(f"Browse: {mlflow_cli} ui --backend-store-uri {tracking_uri(cfg)} --host 127.0.0.1\n"
          f"  then open {ui_link(run.info.experiment_id)} (the demo run; + shows its stages)")


if __name__ == "__main__":
    main()
