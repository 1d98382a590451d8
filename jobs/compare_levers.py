"""Issue 11's sample-efficiency levers, each on the learning curve against the same base (vanilla DFlash).

    python jobs/compare_levers.py [--preset smollm2-135m] [--steps 100] [--out outputs/levers]
                                  [--levers vocab8k,target_init,cosine,no_scaling] [--reference NAME=LOG]
                                  [section.field=value ...]

Every run is `jobs/train.py` with jobs/train_shipped.py's recipe (same data and feature cache as the shipped
drafters: build them first with train_shipped.py), the same seed, steps and validation rows; each lever adds
its overrides to the base. The table printed at the end (and written to <out>/levers.json) is validation
tau (simulated acceptance on held-out rows) at every validation step, and seconds per step.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.train_shipped import recipe, run_train  # noqa: E402

# lever -> overrides on top of the base. "base" is the recipe with the full vocabulary.
LEVERS = {
    "base": [],
    "vocab8k": ["drafter.draft_vocab=8192"],
    # the levers below are measured on top of the reduced vocabulary (the cheaper base they ship with)
    "target_init": ["drafter.draft_vocab=8192", "drafter.init=target_top", "drafter.qk_norm=false"],
    "cosine": ["drafter.draft_vocab=8192", "optim.schedule=cosine"],
    "no_scaling": ["drafter.draft_vocab=8192", "drafter.feature_scaling=false"],
}


def curve(log: Path) -> list[tuple[int, float]]:
    """(step, validation tau) pairs from a training log."""
    pat = re.compile(r"validation at step (\d+):.*sim_acceptance_length ([0-9.]+)")
    return [(int(m.group(1)), float(m.group(2))) for m in map(pat.search, log.read_text().splitlines()) if m]


def seconds_per_step(log: Path) -> float:
    """Seconds per training step from consecutive progress lines, skipping spans that hold a validation."""
    step = re.compile(r"\[train\] step (\d+)/\d+ .*\((\d+) s\)")
    steps = seconds = 0
    prev, clean = None, True
    for line in log.read_text().splitlines():
        if "validation at step" in line or "checkpoint at step" in line:
            clean = False
        m = step.search(line)
        if m:
            s, t = int(m.group(1)), int(m.group(2))
            if prev is not None and clean:
                steps, seconds = steps + s - prev[0], seconds + t - prev[1]
            prev, clean = (s, t), True
    return seconds / steps if steps else float("nan")


def main(argv: list[str] | None = None) -> None:
    from lilicorr.cli import parse_job_args

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=int, default=100)
        p.add_argument("--out", default="outputs/levers")
        p.add_argument("--data", default="outputs/ship", help="train_shipped.py's output (its data/ is reused)")
        p.add_argument("--levers", default=",".join(LEVERS))
        p.add_argument("--reference", action="append", default=[], metavar="NAME=LOG",
                       help="add an earlier run's training log to the table (e.g. base=outputs/ship/base.log, "
                            "the shipped base drafter: the recipe with the full vocabulary, same seed and data)")

    args, _ = parse_job_args(__doc__.split("\n")[0], argv=argv, add_arguments=arguments)
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = (ROOT / args.data).resolve()
    if not (data / "data" / "train").exists():
        raise SystemExit(f"no shipped-recipe data in {data / 'data'}: run jobs/train_shipped.py first")
    names = [n for n in args.levers.split(",") if n]
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        raise SystemExit(f"unknown lever(s) {unknown}; known: {', '.join(LEVERS)}")
    base = recipe(data) + [f"train.max_steps={args.steps}", "train.validate_every=25", "train.checkpoint_every=50"]
    results = {}
    for ref in args.reference:
        name, log = ref.split("=", 1)
        results[name] = {"overrides": ["(earlier run: " + log + ")"], "curve": curve(ROOT / log),
                         "s_per_step": round(seconds_per_step(ROOT / log), 2)}
    for name in names:
        overrides = base + LEVERS[name] + list(args.overrides)
        print(f"[levers] {name}: {' '.join(LEVERS[name]) or '(the recipe)'}", flush=True)
        run_train(out, name, "none", overrides, args.preset)
        log = out / f"{name}.log"
        results[name] = {"overrides": LEVERS[name], "curve": curve(log), "s_per_step": round(seconds_per_step(log), 2)}
        (out / "levers.json").write_text(json.dumps(results, indent=1))
    steps = sorted({s for r in results.values() for s, _ in r["curve"]})
    print("\nvalidation tau by step  " + "  ".join(f"{s:>6d}" for s in steps) + "   s/step")
    for name, r in results.items():
        at = dict(r["curve"])
        print(f"{name:<22} " + "  ".join(f"{at[s]:6.3f}" if s in at else "     -" for s in steps)
              + f"   {r['s_per_step']:.2f}")


if __name__ == "__main__":
    main()
