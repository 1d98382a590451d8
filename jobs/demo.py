"""The main job, end to end on the embedded default (what `make demo` runs).

    python jobs/demo.py [--preset smollm2-135m] [demo.budget=0.5] [section.field=value ...]

Stages, each a real job run as its own process (the same commands a user runs):
  1. regenerate  ShareGPT conversations with the target           (jobs/regenerate.py)
  2. train       vanilla DFlash and LiLiCorr, same data/steps/seed  (jobs/train.py --head none|lilicorr)
  3. generate    AR, DFlash and LiLiCorr on held-out MT-Bench and HumanEval prompts (jobs/generate.py)
  4. report      a table in the layout of paper Table 5 (τ / tok/s / speedup over AR), logged to MLflow
`demo.budget` scales data, steps and prompts (1.0 ≈ 30 min on a 2-core CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lilicorr.cli import parse_job_args  # noqa: E402  (pure Python: bad flags fail fast)

SYSTEMS = [("ar", None), ("dflash", "none"), ("lilicorr", "lilicorr")]  # (engine system, trained head)


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


def write_prompts(benchmark: str, n: int, path: Path) -> None:
    from lilicorr.platform.assets import benchmark_prompts

    rows = benchmark_prompts(benchmark)[:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def format_table(results: dict[tuple[str, str], dict], benchmarks: list[str]) -> str:
    """Paper Table 5 layout: per benchmark, τ / tok/s / speedup over AR for each system (evaluate/tables.py)."""
    from lilicorr.platform.evaluate.tables import format_table5

    return format_table5(results, benchmarks, [s for s, _ in SYSTEMS])


def shipped_drafters_table(preset_name: str, preset: list[str], benchmarks: list[str], results: dict, out: Path,
                           timings: dict[str, float]) -> str:
    """Table 5 again for the drafters shipped under checkpoints/<preset>/ (none shipped: empty string)."""
    from lilicorr.platform.shipped import shipped_checkpoint

    folders = {system: shipped_checkpoint(preset_name, system) for system, head in SYSTEMS if head is not None}
    if not all(folders.values()):
        print(f"\n(no shipped drafters for {preset_name}: {folders})")
        return ""
    shipped: dict[tuple[str, str], dict] = {}
    for bench in benchmarks:
        shipped[(bench, "ar")] = results[(bench, "ar")]
        for system, folder in folders.items():
            shipped[(bench, system)] = run_stage(
                f"generate-shipped[{bench},{system}]",
                ["jobs/generate.py", *preset, "--system", system, "--checkpoint", folder,
                 "--prompts", str(out / f"{bench}.jsonl"), "--out", str(out / f"{bench}-{system}-shipped.jsonl"),
                 "--batch-size", "1"], timings)
    return format_table(shipped, benchmarks)


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_job_args("LiLiCorr end-to-end demo on the embedded default", argv=argv)
    from lilicorr.platform.console import quiet_console
    quiet_console("demo", enabled=argv is None)  # console: stage lines; full log: outputs/logs/
    from lilicorr.platform.tracking import open_parent
    demo_key = open_parent(cfg, "demo")  # the demo's run, opened now: every stage below is its child run
    budget = cfg.demo.budget
    out = ROOT / "outputs" / "demo"
    out.mkdir(parents=True, exist_ok=True)
    preset = ["--preset", args.preset, *args.overrides]
    data_dir = out / "regenerated"
    timings: dict[str, float] = {}
    limit = max(8, int(32 * budget))
    steps = max(10, int((cfg.train.max_steps or 60) * budget))
    n_prompts = max(2, int((cfg.eval.num_prompts or 6) * budget))

    summaries: dict[str, dict] = {}
    summaries["regenerate"] = run_stage("regenerate", ["jobs/regenerate.py", *preset, f"data.limit={limit}",
                                                       f"data.output_dir={data_dir}"], timings)
    checkpoints: dict[str, str] = {}
    for system, head in SYSTEMS:
        if head is None:
            continue
        run_dir = out / f"train-{head}"
        summary = run_stage(f"train[{head}]", ["jobs/train.py", *preset, "--head", head,
                                               f"data.output_dir={data_dir}", f"train.max_steps={steps}",
                                               f"train.output_dir={run_dir}"], timings)
        summaries[f"train[{head}]"] = summary
        checkpoints[system] = summary.get("export_dir", str(run_dir / "export"))

    results: dict[tuple[str, str], dict] = {}
    for bench in cfg.eval.benchmarks:
        prompts = out / f"{bench}.jsonl"
        write_prompts(bench, n_prompts, prompts)
        for system, head in SYSTEMS:
            drafter = ["--checkpoint", checkpoints[system]] if head is not None else []
            results[(bench, system)] = run_stage(
                f"generate[{bench},{system}]",
                ["jobs/generate.py", *preset, "--system", system, *drafter, "--prompts", str(prompts),
                 "--out", str(out / f"{bench}-{system}.jsonl"), "--batch-size", "1"], timings)

    table = format_table(results, cfg.eval.benchmarks)
    print("\n" + table)
    shipped_table = shipped_drafters_table(args.preset, preset, cfg.eval.benchmarks, results, out, timings)
    if shipped_table:
        print("\nShipped drafters (checkpoints/" + args.preset + "/) on the same prompts, AR from the run above:\n"
              + shipped_table)
    print("\nStage wall times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))

    from lilicorr.platform.tracking import run_location, start_run, tracking_uri

    with start_run(cfg, "demo", resume_key=demo_key) as run:
        import mlflow

        for (bench, system), r in results.items():
            for key in ("tau", "tokens_per_s"):
                if key in r:
                    mlflow.log_metric(f"{bench}.{system}.{key}", float(r[key]))
        for name, seconds in timings.items():
            mlflow.log_metric(f"wall_s.{name.replace('[', '.').replace(']', '').replace(',', '.')}", seconds)
        mlflow.log_text(table, "table5.txt")
        if shipped_table:
            mlflow.log_text(shipped_table, "table5_shipped.txt")
        mlflow.log_dict({"stages": summaries, "timings": timings}, "summary.json")
    from lilicorr.platform.evaluate.report import write_report
    from lilicorr.platform.evaluate.run import log_summaries
    log_summaries(cfg, run.info.run_id, results, checkpoints)  # generate results as evaluation cells
    print("\n" + write_report(str(out / "report"), run_id=run.info.run_id, tracking_uri=tracking_uri(cfg)).markdown)
    child_runs = {k: v.get("mlflow_run_id") for k, v in summaries.items() if v.get("mlflow_run_id")}
    print(f"\nMLflow: demo {run_location(run)}")
    for name, run_id in child_runs.items():
        print(f"MLflow: {name} run {run_id}")
    print("Browse: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns.db")


if __name__ == "__main__":
    main()
