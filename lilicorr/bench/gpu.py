"""`python jobs/bench.py gpu [--dry-run] [--out FILE] [--train-layers N]`: the GPU figures in one run.

The decoding figures are gpu_decode.py's; this adds the Serve loader's device placement (gpu_serve_load.py)
and one Qwen3-8B-shape joint training step per head (gpu_train.py). The JSON goes to --out after
every section and to stdout at the end. Kept free of Ray, MLflow and DeepSpeed imports: the GPU machine
has none of them.
"""

from __future__ import annotations

import argparse
import json

import torch

from lilicorr.bench import gpu_decode, gpu_serve_load, gpu_train


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on CPU at tiny shapes")
    ap.add_argument("--time-limit", type=float, default=420.0,
                    help="seconds for the whole run (default 7 min); a section that would pass it is skipped")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--train-layers", type=int, default=0,
                    help="target layers of the training steps (0: the shape's own, 36 for Qwen3-8B)")
    ap.add_argument("--no-train", action="store_true", help="skip the training steps")
    ap.add_argument("--out", default="", help="the JSON object, rewritten after every section")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("bench.py gpu: no CUDA device (use --dry-run on CPU)")
    sections = gpu_serve_load.sections() + (() if args.no_train else gpu_train.sections(args.train_layers))
    res = gpu_decode.run(args.dry_run, args.time_limit, args.new_tokens, out=args.out, extra=sections)
    print(json.dumps(res), flush=True)
    if res["failed_sections"]:
        raise SystemExit(f"bench.py gpu: failed sections: {', '.join(res['failed_sections'])}")
    return res
