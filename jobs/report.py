"""The paper's tables and plots for what was evaluated, as Markdown, CSV and PNG, logged back to MLflow.

    python jobs/report.py --run-id RUN_ID --out outputs/report       # an evaluation, or the demo's run
    python jobs/report.py --experiment lilicorr --out outputs/report  # every evaluation cell in the experiment

Tables (as far as the runs hold the data): 1 and 5 (speedup, τ / TPS / speedup), 3 (stage ms, runs with
--timing), 2/13 (concurrency), 11 (loss-term ablation), 12 (decode rule); plots: τ per benchmark and
system, acceptance per slot, throughput against concurrency. Store: tracking.tracking_uri or
$MLFLOW_TRACKING_URI (default sqlite:///mlruns.db). The report Markdown goes to stdout.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def _add_arguments(p) -> None:
    p.add_argument("--experiment", default=None, help="MLflow experiment name")
    p.add_argument("--run-id", default=None, help="an evaluation run (or a pipeline run above evaluations)")
    p.add_argument("--out", default=None, help="output folder for report.md, CSVs and PNGs (required)")
    p.add_argument("--no-log", action="store_true", help="do not log the report back to MLflow")


def main(argv: list[str] | None = None):
    args, cfg = parse_job_args(__doc__.split("\n")[0], add_arguments=_add_arguments, argv=argv)
    if (args.experiment is None) == (args.run_id is None) or not args.out:
        print("report: error: give --out DIR and exactly one of --experiment NAME or --run-id ID", file=sys.stderr)
        sys.exit(2)
    from lilicorr.platform.evaluate.report import write_report
    from lilicorr.platform.tracking import tracking_uri

    try:
        rep = write_report(args.out, experiment=args.experiment, run_id=args.run_id, tracking_uri=tracking_uri(cfg),
                           log=not args.no_log)
    except Exception as e:  # noqa: BLE001 — an unknown run or experiment: say which
        if type(e).__name__ not in ("ValueError", "MlflowException", "RestException"):
            raise
        print(f"report: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(rep.markdown)
    print(f"[report] {len(rep.files)} files in {args.out}" + (f"; logged to run {rep.run_id}" if rep.run_id else ""),
          file=sys.stderr)
    return rep


if __name__ == "__main__":
    main()
