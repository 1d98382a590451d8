"""The paper's tables and plots for what was evaluated, as Markdown, CSV and PNG, logged back to MLflow.

    python jobs/report.py --run-id RUN_ID --out outputs/report       # an evaluation, or the demo's run
    python jobs/report.py --experiment lilicorr --out outputs/report  # every evaluation cell in the experiment
    python jobs/report.py --curves "DFlash=RUN_ID,LiLiCorr=RUN_ID" --out outputs/curves   # training runs' curves

Tables (as far as the runs hold the data): 1 and 5 (speedup, τ / TPS / speedup), 3 (stage ms, runs with
--timing), 2/13 (concurrency), 11 (loss-term ablation), 12 (decode rule); plots: τ per benchmark and
system, acceptance per slot, throughput against concurrency. --curves: training runs side by side, validation τ
against training tokens (curves.png, curves.csv; lilicorr/platform/train/curves.py). Store: tracking.tracking_uri or
$MLFLOW_TRACKING_URI (default sqlite:///mlruns.db). The report Markdown goes to stdout.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def _fail(msg: str):
    print(f"report: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _add_arguments(p) -> None:
    p.add_argument("--experiment", default=None, help="MLflow experiment name")
    p.add_argument("--run-id", default=None, help="an evaluation run (or a pipeline run above evaluations)")
    p.add_argument("--out", default=None, help="output folder for report.md, CSVs and PNGs (required)")
    p.add_argument("--no-log", action="store_true", help="do not log the report back to MLflow")
    p.add_argument("--curves", default=None, help="LABEL=RUN_ID,...: training runs' validation curves on one plot")
    p.add_argument("--title", default="validation τ against training tokens", help="the --curves plot's title")


def main(argv: list[str] | None = None):
    args, cfg = parse_job_args(__doc__.split("\n")[0], add_arguments=_add_arguments, argv=argv)
    if args.curves is not None:
        return _curves(args, cfg)
    if (args.experiment is None) == (args.run_id is None) or not args.out:
        _fail("give --out DIR and exactly one of --experiment NAME or --run-id ID")
    from lilicorr.platform.evaluate.report import write_report
    from lilicorr.platform.tracking import tracking_uri

    try:
        rep = write_report(args.out, experiment=args.experiment, run_id=args.run_id, tracking_uri=tracking_uri(cfg),
                           log=not args.no_log)
    except Exception as e:  # noqa: BLE001 — an unknown run or experiment: say which
        if type(e).__name__ not in ("ValueError", "MlflowException", "RestException"):
            raise
        _fail(str(e))
    print(rep.markdown)
    print(f"[report] {len(rep.files)} files in {args.out}" + (f"; logged to run {rep.run_id}" if rep.run_id else ""),
          file=sys.stderr)
    return rep


def _curves(args, cfg) -> dict:
    from pathlib import Path

    from mlflow import MlflowClient

    from lilicorr.platform.tracking import absolute_uri, tracking_uri
    from lilicorr.platform.train.curves import curves_csv, parse_runs, plot_curves, read_curve

    if not args.out:
        _fail("--curves needs --out DIR")
    try:
        runs = parse_runs(args.curves)
    except ValueError as e:
        _fail(str(e))
    client = MlflowClient(absolute_uri(tracking_uri(cfg)))
    curves = {}
    for label, run_id in runs.items():
        try:
            curves[label] = read_curve(client, run_id)
        except Exception as e:  # noqa: BLE001 — an unknown run id: say which
            _fail(f"run {run_id} ({label}): {e}")
        if not curves[label]:
            _fail(f"run {run_id} ({label}) logged no validation τ with training tokens")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curves.csv").write_text(curves_csv(curves))
    plot_curves(curves, args.title).savefig(out / "curves.png", dpi=110)
    print(curves_csv(curves), end="")
    print(f"[report] curves.png and curves.csv in {out}", file=sys.stderr)
    return curves


if __name__ == "__main__":
    main()
