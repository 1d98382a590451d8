"""Evaluate decoding systems on benchmarks: Ray fan-out, one MLflow child run per cell, a report at the end.

    python jobs/evaluate.py --preset smollm2-135m --systems ar,dflash,lilicorr,ddtree,hf,hf-pld \\
        --benchmarks mt-bench,humaneval [--checkpoint DIR|models:/NAME@ALIAS|name=DIR,... | --drafter random] \\
        [--temperatures 0,1] [--seeds 0,1,2] [--concurrency 1,8] [--num-prompts N] [--timing] \\
        [--workers N] [--local-file gsm8k=path.jsonl] [--report-dir DIR] [section.field=value ...]

Systems: ar, dflash, lilicorr, lilicorr-viterbi, lilicorr-margin, domino, dspark, dspark-sampled, ddtree,
and the transformers peers hf (`generate`) and hf-pld (prompt-lookup decoding). Benchmarks (each prompt in the
target's chat template): the packaged mt-bench, mt-bench-turn2, alpaca, long-2k ... long-16k, humaneval,
math-500-mmath, aime-2025-i, mmath-multilingual, and the hub's gsm8k, math-500, aime-2025, mbpp, livecodebench,
alpacaeval, speed-bench[-1k|2k|8k|16k|32k]; lilicorr/platform/evaluate/benchmarks.py has their sources, sizes and
column mappings. --num-prompts N takes the first N of each.

A hub benchmark that cannot be reached is skipped with a one-line reason (naming its packaged subset, if any) and
the run goes on with the others; --local-file BENCH=PATH runs a local copy in the hub's schema instead (e.g.
alpacaeval=alpaca_eval-0.6.6/example/outputs.json from alpaca-eval's sdist). docs/evaluation-benchmarks.md describes
the packaged mt-bench-turn2, alpaca and long-* sets. Every (system, benchmark,
T, seed, concurrency) runs as a Ray actor task and becomes a child run of this evaluation's MLflow run;
the report (jobs/report.py) is written to --report-dir (default <eval.output_dir>/report) and logged back.
The last stdout line is JSON: parent run id, cells, skipped systems/benchmarks, report dir.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def _fail(msg: str):
    print(f"evaluate: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _list(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def _add_arguments(p) -> None:
    p.add_argument("--systems", type=_list(str), default=["ar", "dflash", "lilicorr"])
    p.add_argument("--benchmarks", type=_list(str), default=None, help="default: eval.benchmarks")
    p.add_argument("--checkpoint", default=None,
                   help="an export, a folder of exports (dflash/, lilicorr/, ...), name=DIR,... or models:/NAME@ALIAS; "
                        "default: checkpoints/<preset>/")
    p.add_argument("--drafter", default=None, choices=["random"], help="untrained random drafters + heads")
    p.add_argument("--temperatures", type=_list(float), default=[0.0])
    p.add_argument("--seeds", type=_list(int), default=[0])
    p.add_argument("--concurrency", type=_list(int), default=[1])
    p.add_argument("--num-prompts", type=int, default=None, help="prompts per benchmark (default eval.num_prompts)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--timing", action="store_true", help="per-block stage timers (Table 3)")
    p.add_argument("--workers", type=int, default=0, help="Ray actors (0: one per GPU, else 1)")
    p.add_argument("--local-file", action="append", default=[], metavar="BENCH=PATH",
                   help="a local copy (JSONL/JSON/Parquet, hub schema) of a hub benchmark")
    p.add_argument("--report-dir", default=None)
    p.add_argument("--no-report", action="store_true")


def main(argv: list[str] | None = None) -> dict:
    args, cfg = parse_job_args(__doc__.split("\n")[0], add_arguments=_add_arguments, argv=argv)
    if args.checkpoint and args.drafter:
        _fail("give --checkpoint or --drafter random, not both")
    if args.max_new_tokens is not None:
        cfg.engine.max_new_tokens = args.max_new_tokens
    local = {}
    for item in args.local_file:
        name, _, path = item.partition("=")
        if not path or not os.path.exists(path):
            _fail(f"--local-file {item!r}: expected BENCH=PATH to an existing file")
        local[name] = path

    from lilicorr.platform.evaluate.plan import known_systems
    from lilicorr.platform.evaluate.run import EvalArgs, evaluate

    unknown = [s for s in args.systems if s not in known_systems()]
    if unknown:
        _fail(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(known_systems())}")
    eargs = EvalArgs(systems=args.systems, benchmarks=args.benchmarks or list(cfg.eval.benchmarks),
                     temperatures=args.temperatures, seeds=args.seeds, concurrency=args.concurrency,
                     num_prompts=args.num_prompts, checkpoint=args.checkpoint, random_drafter=args.drafter == "random",
                     timing=args.timing, workers=args.workers, local_files=local)
    from lilicorr.platform.evaluate.preflight import ExportMismatch

    try:
        outcome = evaluate(cfg, eargs)
    except ExportMismatch as e:  # raised before Ray or MLflow start: a plain message, no traceback
        _fail(str(e))
    summary = {"mlflow_run_id": outcome.parent_run_id, "experiment_id": outcome.experiment_id,
               "cells": len(outcome.results), "failed": sum("error" in r for r in outcome.results),
               "skipped": outcome.plan.skipped}
    if not args.no_report:
        from lilicorr.platform.evaluate.report import write_report
        from lilicorr.platform.tracking import tracking_uri

        out = args.report_dir or os.path.join(cfg.eval.output_dir, "report")
        rep = write_report(out, run_id=outcome.parent_run_id, tracking_uri=tracking_uri(cfg))
        print(rep.markdown)
        summary["report_dir"] = out
    import ray

    ray.shutdown()
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
