"""Jointly train a DFlash drafter and a speculative head on regenerated data (Ray Train + DeepSpeed).

    python jobs/train.py --preset smollm2-135m --head lilicorr data.output_dir=outputs/regenerated
    RAY_AUTH_MODE=token RAY_ADDRESS=http://127.0.0.1:8265 \
        ray job submit --working-dir . -- python jobs/train.py --preset smollm2-135m train.max_steps=20

`--head lilicorr|none|domino|dspark` (none = vanilla DFlash) trains each system on the same data, steps,
batch and seed. Progress lines go to stdout; the last stdout line is the result as JSON (export_dir,
mlflow_run_id, steps, metrics), which jobs/demo.py reads.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402

HEADS = ("lilicorr", "none", "domino", "dspark")


def main(argv: list[str] | None = None) -> dict:
    args, cfg = parse_job_args(
        __doc__.split("\n")[0], argv=argv,
        add_arguments=lambda p: p.add_argument("--head", choices=HEADS, default=None,
                                               help="head to train with the drafter (default: the preset's head.kind)"))
    from lilicorr.platform.console import quiet_console
    quiet_console("train", enabled=argv is None)  # console: stage lines; full log: outputs/logs/
    if args.head is not None:
        cfg.head.kind = args.head

    from dataclasses import asdict

    from lilicorr.platform.train.driver import train

    result = train(cfg)
    import ray

    ray.shutdown()  # no late worker log lines after the result line
    print(json.dumps(asdict(result), sort_keys=True), flush=True)
    return asdict(result)


if __name__ == "__main__":
    main()
