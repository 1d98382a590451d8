"""Ray Tune sweep over training settings, or one of the paper's ablations, on Ray Train trials.

    python jobs/sweep.py --preset smollm2-135m data.output_dir=outputs/regenerated sweep.num_samples=6
    python jobs/sweep.py --preset tiny-random sweep.num_samples=2 data.output_dir=DIR
    python jobs/sweep.py --preset smollm2-135m --ablation distractor data.output_dir=outputs/regenerated
    python jobs/sweep.py --preset smollm2-135m --ablation decode-rule --export outputs/train/export
    python jobs/sweep.py --preset smollm2-135m --confirm 2 --confirm-prompts 6   # + engine τ of the 2 best

The search space is `sweep.space` ("loss.gamma=0.1|0.25|0.5", "loss.lam=loguniform:0.1:10", ...), checked
like any override before Ray starts. The objective is validation τ (`sweep.metric`). Rerunning the same
command after an interruption resumes it (Tuner.restore): finished trials are not run again. The last
stdout line is a JSON summary (parent run, best config file, table file).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402
from lilicorr.config import ConfigError  # noqa: E402

ABLATIONS = ("distractor", "margin", "decode-rule")


def _arguments(p) -> None:
    p.add_argument("--ablation", choices=ABLATIONS, default=None,
                   help="run a named ablation instead of the search (Tables 11, 15, 12)")
    p.add_argument("--export", default=None, help="decode-rule ablation: the trained export folder to score")
    p.add_argument("--confirm", type=int, default=0, metavar="N",
                   help="after the sweep, decode with the engine (jobs/evaluate.py) for the N best configs; "
                        "with --ablation: every arm (decode-rule: greedy and Viterbi), then jobs/report.py's table")
    p.add_argument("--confirm-prompts", type=int, default=None, metavar="P", help="prompts per benchmark for --confirm")


def main(argv: list[str] | None = None) -> dict:
    args, cfg = parse_job_args(__doc__.split("\n")[0], argv=argv, add_arguments=_arguments)
    from lilicorr.platform.sweep.ablations import check_ablation
    from lilicorr.platform.sweep.space import parse_space

    try:  # the fast check: space keys and values, sweep settings, before Ray or torch load
        if args.ablation is None:
            parse_space(cfg)
        else:
            check_ablation(cfg, args.ablation, args.export)
    except ConfigError as e:
        sys.stderr.write(f"sweep.py: config error: {e}\n")
        raise SystemExit(2)

    if args.ablation == "decode-rule":
        from lilicorr.platform.sweep.ablations import decode_rule_ablation

        summary = decode_rule_ablation(cfg, args.export)
        parent, report_dir = summary["parent_run_id"], Path(summary["table"]).parent / "report"
    else:
        from lilicorr.platform.sweep.ablations import run_ablation
        from lilicorr.platform.sweep.preflight import CorpusError
        from lilicorr.platform.sweep.runner import run_sweep

        try:
            outcome = run_sweep(cfg) if args.ablation is None else run_ablation(cfg, args.ablation)
        except CorpusError as e:  # raised before Ray or MLflow start: a plain message, no traceback
            sys.stderr.write(f"sweep.py: error: {e}\n")
            raise SystemExit(2)
        summary = {"sweep": outcome.name, "parent_run_id": outcome.parent_run_id, "best_config": outcome.best_config,
                   "best_run_id": outcome.best_run_id, "trials": len(outcome.records), **outcome.files}
        parent, report_dir = outcome.parent_run_id, Path(outcome.sweep_dir) / "report" / "paper"
    if args.confirm:
        from lilicorr.platform.evaluate.report import write_report
        from lilicorr.platform.sweep.confirm import confirm_decode_rule, confirm_top
        from lilicorr.platform.sweep.runner import absolutized

        acfg = absolutized(cfg)
        if args.ablation == "decode-rule":  # Table 12 measured by the engine
            confirm_decode_rule(acfg, parent, args.export, args.confirm_prompts)
        else:
            top = args.confirm if args.ablation is None else max(args.confirm, 2)  # an ablation: every arm
            summary["engine_confirmation"] = confirm_top(acfg, parent, outcome.records, top, args.confirm_prompts)
            print(summary["engine_confirmation"], flush=True)
        if args.ablation is not None:  # jobs/report.py's matching table (11 for the loss terms, 12 decode rule)
            print(write_report(str(report_dir), run_id=parent, tracking_uri=acfg.tracking.tracking_uri).markdown,
                  flush=True)
    import ray

    ray.shutdown()
    print(json.dumps(summary, sort_keys=True), flush=True)
    return summary


if __name__ == "__main__":
    main()
