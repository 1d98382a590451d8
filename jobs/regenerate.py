"""Regenerate a training corpus with the target (paper §4.1) as a Ray Data job.

    python jobs/regenerate.py --preset smollm2-135m data.limit=64
    RAY_AUTH_MODE=token RAY_ADDRESS=http://127.0.0.1:8265 \
        ray job submit --working-dir . -- python jobs/regenerate.py --preset smollm2-135m data.limit=64 \
        data.output_dir=$PWD/outputs/regenerated    # absolute under ray job submit (README: On a Ray cluster)

Rerunning with the same settings resumes: finished shards are skipped. Progress goes to stderr, the
summary to stdout and MLflow (metrics, summary, manifest, sample conversations).

    python jobs/regenerate.py --preset smollm2-135m data.runner=local data.limit=64    # one machine, no Ray
`data.runner=local` needs neither Ray nor MLflow (a bare GPU machine): without MLflow installed the run is
not tracked, and says so; its summary and manifest are in data.output_dir all the same.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    _, cfg = parse_job_args(__doc__.split("\n")[0], argv=argv)
    if cfg.data.generate_backend == "vllm":  # an environment without vllm fails here, as a config error does
        from lilicorr.config import ConfigError
        from lilicorr.platform.regenerate.vllm_processor import preflight

        try:
            preflight(cfg)
        except ConfigError as e:
            print(f"regenerate.py: config error: {e}", file=sys.stderr)
            sys.exit(2)  # as parse_job_args exits on a bad value
    from lilicorr.platform.console import quiet_console
    quiet_console("regenerate", enabled=argv is None)  # console: stage lines; full log: outputs/logs/

    from lilicorr.platform.regenerate.pipeline import run_regeneration
    from lilicorr.platform.regenerate.summary import format_summary, log_to_mlflow
    from lilicorr.platform.tracking import FINGERPRINT_TAG, fingerprint_hash, run_location, start_run, write_lineage

    run = None
    if cfg.data.runner == "local" and importlib.util.find_spec("mlflow") is None:
        print("regenerate.py: mlflow is not installed here, so this run is not tracked (summary and manifest: "
              f"{cfg.data.output_dir})", file=sys.stderr)
        result = run_regeneration(cfg)
    else:
        with start_run(cfg, "regenerate") as run:
            result = run_regeneration(cfg)
            log_to_mlflow(result, result["samples"], result["manifest"])
            # lineage: training runs on this corpus carry the same fingerprint and this run's id
            fp = fingerprint_hash((result["manifest"] or {}).get("fingerprint", result["manifest"]))
            __import__("mlflow").set_tag(FINGERPRINT_TAG, fp)
            write_lineage(cfg.data.output_dir, run.info.run_id, fingerprint=fp)
    print(format_summary(result))
    if run is not None:
        print(f"mlflow: {run_location(run)}")
    # Last stdout line: the summary as JSON (jobs/demo.py reads it).
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "manifest")}))
    return result


if __name__ == "__main__":
    main()
