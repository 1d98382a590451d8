"""Issue 11's sample-efficiency levers, each on the learning curve against the same base (vanilla DFlash).

    python jobs/compare_levers.py [--preset smollm2-135m] [--steps 100] [--out outputs/levers]
                                  [--levers vocab8k,target_init,cosine,no_scaling] [--reference NAME=LOG]
                                  [--regenerated DIR] [section.field=value ...]

Every run is `jobs/train.py` with jobs/train_shipped.py's recipe (same data and feature cache as the shipped
drafters: build them first with train_shipped.py), the same seed, steps and validation rows; each lever adds
its overrides to the base. The table printed at the end (and written to <out>/levers.json) is validation
tau (simulated acceptance on held-out rows) and validation loss at every validation step, seconds per step,
and the training tokens a step reads.

--regenerated DIR adds two levers (issue 11 item 5, the corpus's own answers vs the target's): "regenerated",
the training rows of a regeneration run (`jobs/regenerate.py ... data.output_dir=DIR`), and "corpus_same",
the corpus's own rows of the same conversations (labels relabeled by the target, as in the recipe): the same
prompts, only the answers differ. Both are validated on the same held-out rows as every other lever.
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


def curve(log: Path, metric: str = "sim_acceptance_length") -> list[tuple[int, float]]:
    """(step, validation metric) pairs from a training log (tau by default; "loss" for the validation loss)."""
    pat = re.compile(rf"validation at step (\d+):.* {metric} ([0-9.]+)")
    return [(int(m.group(1)), float(m.group(2))) for m in map(pat.search, log.read_text().splitlines()) if m]


def tokens_per_step(data_dir: Path, seq_len: int, rows_per_step: int) -> float:
    """Training tokens one step reads: rows per step x the mean training row length (cropped to seq_len)."""
    import pyarrow.parquet as pq

    lengths = [min(len(ids), seq_len) for f in sorted((data_dir / "train").glob("*.parquet"))
               for ids in pq.read_table(f, columns=["input_ids"]).column("input_ids").to_pylist()]
    return rows_per_step * sum(lengths) / max(1, len(lengths))


def mixed_data_dir(out: Path, regenerated: Path, heldout_from: Path) -> tuple[Path, Path]:
    """Two data directories sharing heldout_from's held-out rows (symlinked): the regenerated training rows,
    and heldout_from's own training rows of the same conversation ids (the corpus's answers)."""
    import pyarrow.parquet as pq

    from lilicorr.platform.train.shards import write_shards

    if not (regenerated / "train").exists():
        raise SystemExit(f"--regenerated: no training shards under {regenerated / 'train'}")
    regen, same = out / "data-regenerated", out / "data-corpus-same"
    for d, train in ((regen, regenerated / "train"), (same, None)):
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "heldout").exists():
            (d / "heldout").symlink_to((heldout_from / "heldout").resolve(), target_is_directory=True)
        if train is not None and not (d / "train").exists():
            (d / "train").symlink_to(train.resolve(), target_is_directory=True)
    if not (same / "train").exists():
        def rows(split_dir: Path) -> list[dict]:
            return [r for f in sorted(split_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]

        ids = {r["id"] for r in rows(regenerated / "train")}
        corpus = [r for r in rows(heldout_from / "train") if r["id"] in ids]
        if not corpus:
            raise SystemExit(f"--regenerated: none of its conversations are among {heldout_from / 'train'}'s rows")
        write_shards(corpus, same, "train", 64)
    return regen, same


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
    from lilicorr.config import load_config

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=int, default=100)
        p.add_argument("--out", default="outputs/levers")
        p.add_argument("--data", default="outputs/ship", help="train_shipped.py's output (its data/ is reused)")
        p.add_argument("--levers", default=",".join(LEVERS))
        p.add_argument("--reference", action="append", default=[], metavar="NAME=LOG",
                       help="add an earlier run's training log to the table (e.g. base=outputs/ship/base.log, "
                            "the shipped base drafter: the recipe with the full vocabulary, same seed and data)")
        p.add_argument("--regenerated", default=None, metavar="DIR",
                       help="a regeneration run's output: adds the lever 'regenerated' (its rows, same held-out rows)")

    args, _ = parse_job_args(__doc__.split("\n")[0], argv=argv, add_arguments=arguments)
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = (ROOT / args.data).resolve()
    if not (data / "data" / "train").exists():
        raise SystemExit(f"no shipped-recipe data in {data / 'data'}: run jobs/train_shipped.py first")
    names = [n for n in args.levers.split(",") if n]
    levers = dict(LEVERS)
    data_of = {n: data / "data" for n in levers}
    if args.regenerated:
        regen, same = mixed_data_dir(out, (ROOT / args.regenerated).resolve(), data / "data")
        for name, d in (("corpus_same", same), ("regenerated", regen)):
            levers[name] = ["drafter.draft_vocab=8192", f"data.output_dir={d}"]
            data_of[name] = d
            names += [] if name in names else [name]
    unknown = [n for n in names if n not in levers]
    if unknown:
        raise SystemExit(f"unknown lever(s) {unknown}; known: {', '.join(levers)} (regenerated: with --regenerated)")
    base = recipe(data) + [f"train.max_steps={args.steps}", "train.validate_every=25", "train.checkpoint_every=50"]
    results = {}
    cfg = load_config(args.preset, base + list(args.overrides))
    for ref in args.reference:
        name, log = ref.split("=", 1)
        results[name] = {"overrides": ["(earlier run: " + log + ")"], "curve": curve(ROOT / log),
                         "loss": curve(ROOT / log, "loss"), "s_per_step": round(seconds_per_step(ROOT / log), 2)}
    for name in names:
        overrides = base + levers[name] + list(args.overrides)
        print(f"[levers] {name}: {' '.join(levers[name]) or '(the recipe)'}", flush=True)
        run_train(out, name, "none", overrides, args.preset)
        log = out / f"{name}.log"
        results[name] = {"overrides": levers[name], "curve": curve(log), "loss": curve(log, "loss"),
                         "s_per_step": round(seconds_per_step(log), 2),
                         "tokens_per_step": round(tokens_per_step(data_of[name], cfg.train.seq_len,
                                                                  cfg.train.global_batch_size))}
        (out / "levers.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: dict) -> None:
    steps = sorted({s for r in results.values() for s, _ in r["curve"]})
    for title, key in (("validation tau", "curve"), ("validation loss", "loss")):
        print(f"\n{title + ' by step':<22} " + "  ".join(f"{s:>6d}" for s in steps) + "   s/step  tokens/step")
        for name, r in results.items():
            at = dict(r.get(key, []))
            print(f"{name:<22} " + "  ".join(f"{at[s]:6.3f}" if s in at else "     -" for s in steps)
                  + f"   {r['s_per_step']:6.2f}  {r.get('tokens_per_step', '-'):>11}")


if __name__ == "__main__":
    main()
