"""Learning-curve comparison of the LiLiCorr head's open choices (issue 16), single process, CPU-sized.

    nice -n 10 .venv/bin/python jobs/ablate_head.py [--preset tiny-random] [section.field=value ...] --out /tmp/ablate.json

Every run shares the data (ShareGPT conversations through the target's chat template, a fixed
train/validation split), the step count and the seeds; the frozen target's pass over each row is computed
once and reused by all runs (it is deterministic). The drafter is first warmed up as vanilla DFlash
(`--warm-steps`), so the head sees candidate lattices whose top-K holds the ground truth often enough to
learn from; every run then starts from that drafter and trains drafter + head jointly with the Table 4
optimiser. Validation tau = the simulated acceptance length (JointModel's `sim_acceptance_length`:
the head's proposal against the target's greedy tokens, teacher-forced) over held-out rows, with
anchors drawn from a generator seeded by the row index, so it depends on the model only.

`--choices` names the HeadConfig fields to flip one at a time against the base config (ours: the first
value of each field in LILICORR_CHOICES, whatever the preset's defaults); each variant differs from the
base in that one field. The summary is mean ± std over seeds of the final
validation tau and of its mean over the last half of the evaluations.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from lilicorr.cli import parse_job_args  # noqa: E402  (pure Python: a bad command line fails fast)


def _arguments(ap) -> None:
    ap.add_argument("--choices", default=None, help="HeadConfig fields to flip (default: every LiLiCorr choice)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warm-steps", type=int, default=60)
    ap.add_argument("--warm-lr", type=float, default=None, help="drafter LR of the warm-up (default: optim's)")
    ap.add_argument("--warm-cache", default=None, help="safetensors file: reuse the warm drafter across invocations")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--train-rows", type=int, default=48)
    ap.add_argument("--val-rows", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)  # 1: a loaded 2-core box thrashes with more
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of tiny-random rows")
    ap.add_argument("--out", default="ablate_head.json")
    ap.add_argument("--skip-base", action="store_true", help="only the variants (merge with an earlier base run)")


def main(argv=None) -> int:
    args, _ = parse_job_args(__doc__.splitlines()[0], add_arguments=_arguments, argv=argv, default_preset="tiny-random")
    from _ablate_head import run  # beside this file (sys.path[0] when run as a script)

    return run(args, list(args.overrides))


if __name__ == "__main__":
    raise SystemExit(main())
