"""Jointly train a DFlash drafter and a speculative head on regenerated data (Ray Train + DeepSpeed).

    python jobs/train.py --preset smollm2-135m --head lilicorr data.output_dir=outputs/regenerated
    RAY_AUTH_MODE=token RAY_ADDRESS=http://127.0.0.1:8265 \
        ray job submit --working-dir . -- python jobs/train.py --preset smollm2-135m train.max_steps=20
    python jobs/train.py --preset smollm2-135m train.runner=local train.use_gpu=true ...   # one GPU, no Ray

`train.runner=local` runs the same loop in this process (lilicorr/platform/train/local.py): no Ray or DeepSpeed, and
without MLflow installed the run is untracked; rerunning the command resumes from its newest checkpoint.

`--head lilicorr|none|domino|dspark` (none = vanilla DFlash) trains each system on the same data, steps,
batch and seed. `--export-layout zlab` also writes the export in the layout vLLM / SGLang load, beside it
(EXPORT_DIR-zlab; jobs/export.py does the same for an existing export). Progress lines go to stdout; the
last stdout line is the result as JSON (export_dir, mlflow_run_id, steps, metrics), which jobs/demo.py reads.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402
from lilicorr.config.choices import HEAD_KINDS  # noqa: E402


def _add_arguments(p) -> None:
    p.add_argument("--head", choices=HEAD_KINDS, default=None,
                   help="head to train with the drafter (default: the preset's head.kind)")
    p.add_argument("--export-layout", choices=["zlab"], default=None,
                   help="also write the final export in this layout, to EXPORT_DIR-zlab (result key zlab_dir)")


def main(argv: list[str] | None = None) -> dict:
    args, cfg = parse_job_args(__doc__.split("\n")[0], argv=argv, add_arguments=_add_arguments)
    from lilicorr.platform.console import quiet_console
    quiet_console("train", enabled=argv is None)  # console: stage lines; full log: outputs/logs/
    if args.head is not None:
        cfg.head.kind = args.head
    if args.export_layout == "zlab":  # refused before any training, not after it
        from lilicorr.models.export import zlab_refusal

        if reason := zlab_refusal(cfg):
            raise SystemExit(f"[train] --export-layout zlab refused: {reason}")

    from dataclasses import asdict

    from lilicorr.platform.train.driver import train

    result = train(cfg)
    if cfg.train.runner == "ray":
        import ray

        ray.shutdown()  # no late worker log lines after the result line
    out = asdict(result)
    if args.export_layout:
        from lilicorr.platform.export_layouts import export_layout

        out[f"{args.export_layout}_dir"] = f"{result.export_dir}-{args.export_layout}"
        for w in export_layout(args.export_layout, result.export_dir, out[f"{args.export_layout}_dir"]):
            print(f"[train] export warning: {w}", file=sys.stderr, flush=True)
    print(json.dumps(out, sort_keys=True), flush=True)
    return out


if __name__ == "__main__":
    main()
