"""Train the drafters shipped under checkpoints/smollm2-135m/: data, feature cache, both heads.

    python jobs/train_shipped.py --preset smollm2-135m-ship --continue --steps 150 --out outputs/v6 [--ship]

v6 on: the preset `smollm2-135m-ship` holds the recipe and reads the packaged regenerated corpus
(corpora/smollm2-135m/), so steps 1-2 below are the corpus's feature cache only; `--continue` starts each
head from its own shipped export (checkpoints/smollm2-135m/<head>: drafter and head) for the same --steps
on the same data, instead of a base phase. Without a packaged corpus (the smollm2-135m preset: v4 and before):

    python jobs/train_shipped.py [--preset smollm2-135m] [--rows 1200] [--base-steps 100] [--steps 50]
                                 [--out outputs/ship] [--ship] [--base-init EXPORT] [--heads lilicorr,dflash,...]
                                 [--head-set section.field=value ...]   (the heads phase only)
                                 [section.field=value ...]   (applied after the recipe's own overrides)

1. data     ShareGPT conversations tokenized as they are (their own answers); the labels are relabeled in
            training with the target's greedy token (train.labels=target), so no slow regeneration.
2. cache    the frozen target's states for every row, once (Ray Data stage; train.feature_cache=true).
3. base     vanilla DFlash for --base-steps, from scratch or from --base-init (an earlier export, e.g. the
            shipped one): a drafter that already proposes sensible candidates (the LiLiCorr head learns
            nothing from candidate lists without the right token).
4. heads    from that export (train.init_from), each of --heads (default LiLiCorr and vanilla DFlash; also
            domino, dspark) trains --steps more on the same data with the same seed: the same starting
            point and budget for every system.
5. --ship   copy the DFlash and LiLiCorr exports as bf16 safetensors + config.json + metrics.json to
            checkpoints/smollm2-135m/ (the others stay under <out>/<head>/export: the repository's size cap).
Progress lines go to <out>/<head>.log; the recipe (overrides) is printed first and stored with the export.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADS = {"dflash": "none", "lilicorr": "lilicorr", "domino": "domino", "dspark": "dspark"}  # export -> head.kind
SHIPPED = ("dflash", "lilicorr")
SHIP_DIR = ROOT / "checkpoints" / "smollm2-135m"


def recipe(out: Path) -> list[str]:
    """The shipped recipe as overrides of the smollm2-135m preset (each lever is named in lilicorr/config/schema.py)."""
    return [
        f"data.output_dir={out / 'data'}", "train.seq_len=384", "train.global_batch_size=4", "train.num_workers=1",
        "train.epochs=100", "train.checkpoint_every=25", "train.validate_every=25",
        "train.val_max_rows=24", "train.log_every=5",
        "train.feature_cache=true", "train.feature_dtype=bfloat16", "train.labels=target", "train.distill=0.5",
        "drafter.mask=learned", "drafter.num_captured=4", "drafter.anchors_per_seq=128", "drafter.feature_scaling=true",
        "drafter.draft_vocab=8192",
        "optim.schedule=constant", "optim.warmup_fraction=0.04", "optim.lr_drafter=1e-3", "optim.lr_head=5e-4",
    ]


def make_data(out: Path, rows: int, preset: str) -> None:
    if (out / "data" / "train").exists():
        print(f"[ship] data: reusing {out / 'data'}", flush=True)
        return
    subprocess.run([sys.executable, "-m", "lilicorr.platform.train.shards", "--preset", preset, "--limit", str(rows),
                    "--out", str(out / "data")], cwd=ROOT, check=True)


def build_cache(overrides: list[str], preset: str, log: Path) -> None:
    """The feature cache is built by the first training job; build it once here so both heads share it."""
    code = ("import ray; from lilicorr.config import load_config; "
            "from lilicorr.platform.train.features import build_feature_cache; "
            f"ray.init(address='local', include_dashboard=False); "
            f"build_feature_cache(load_config({preset!r}, {overrides!r}))")
    with open(log, "a") as f:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, stdout=f, stderr=subprocess.STDOUT)


def run_train(out: Path, name: str, head: str, overrides: list[str], preset: str) -> dict:
    """One jobs/train.py process (its progress in <out>/<name>.log); returns its result line."""
    log = out / f"{name}.log"
    with open(log, "w") as f:
        # On a machine shared with other jobs Ray's memory monitor counts their memory too; kill only near full.
        env = {**os.environ, "RAY_memory_usage_threshold": os.environ.get("RAY_memory_usage_threshold", "0.98")}
        rc = subprocess.run([sys.executable, "jobs/train.py", "--preset", preset, "--head", head, *overrides,
                             f"train.output_dir={out / name}"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env=env).returncode
    last = log.read_text().strip().splitlines()[-1:]
    if rc != 0 or not last:
        raise SystemExit(f"[ship] training {name} failed (exit {rc}); see {log}")
    result = json.loads(last[0])
    print(f"[ship] {name}: {result['steps']} steps, val τ {result['metrics'].get('val_sim_acceptance_length', float('nan')):.3f}",
          flush=True)
    return result


def ship(name: str, export: Path, result: dict, wall_s: float, data_dir: Path, command: str) -> Path:
    """bf16 safetensors + config.json + metrics.json under checkpoints/smollm2-135m/<name>/."""
    import torch
    from safetensors.torch import load_file, save_file

    from lilicorr.models.export import read_meta
    from lilicorr.models.vocab_ranking import VOCAB_RANKING_FILE

    from lilicorr.platform.corpus import is_corpus, read_manifest

    dest = SHIP_DIR / name
    dest.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(str(export / "model.safetensors")).items()}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": read_meta(export).format})
    (dest / "config.json").write_text((export / "config.json").read_text())
    ranking = export / VOCAB_RANKING_FILE  # a full-vocabulary drafter's token ranking (engine.draft_vocab)
    if ranking.exists():
        shutil.copyfile(ranking, dest / VOCAB_RANKING_FILE)
    else:
        (dest / VOCAB_RANKING_FILE).unlink(missing_ok=True)
    if is_corpus(str(data_dir)):  # the packaged corpus's own fingerprint (its files' sha256)
        fingerprint = read_manifest(data_dir)["fingerprint"]
    else:
        manifest = next(data_dir.glob("features-*/manifest.json"), None)
        fingerprint = json.loads(manifest.read_text())["fingerprint"] if manifest else None
    meta = {"metrics": result.get("metrics", {}), "steps": result.get("steps"), "wall_s": round(wall_s, 1),
            "mlflow_run_id": result.get("mlflow_run_id"), "recipe": command,
            "corpus": os.path.relpath(data_dir, ROOT) if Path(data_dir).is_relative_to(ROOT) else str(data_dir),
            "data_fingerprint": fingerprint}
    (dest / "metrics.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return dest


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=1200, help="ShareGPT conversations to tokenize")
    p.add_argument("--base-steps", type=int, default=100,
                   help="steps of the vanilla DFlash base drafter; 0 with --base-init: the heads start from that "
                        "export (its head too when the kind matches), e.g. to train a shipped LiLiCorr head further")
    p.add_argument("--steps", type=int, default=50, help="further steps per head from the base (same for both)")
    p.add_argument("--out", default="outputs/ship")
    p.add_argument("--ship", action="store_true", help="copy the DFlash and LiLiCorr exports to checkpoints/smollm2-135m/")
    p.add_argument("--continue", dest="cont", action="store_true",
                   help="no base phase: each head continues its own shipped export (checkpoints/smollm2-135m/<head>)")
    p.add_argument("--base-init", default=None, help="start the base drafter from this export (else from scratch)")
    p.add_argument("--heads", default="lilicorr,dflash", help=f"heads trained from the base: {', '.join(HEADS)}")
    p.add_argument("--head-set", action="append", default=[], metavar="section.field=value",
                   help="an override for the heads phase only (repeatable), e.g. optim.lr_drafter=1e-4: a drafter "
                        "restarted at the base's LR after its decay loses what the decay gained")


def _steps_taken(export: Path) -> int:
    """The optimizer steps behind an export (a shipped one's metrics.json; 0 when it has none)."""
    metrics = export / "metrics.json"
    return json.loads(metrics.read_text()).get("steps", 0) if metrics.exists() else 0


def main(argv: list[str] | None = None) -> None:
    from lilicorr.cli import parse_job_args
    from lilicorr.config import load_config

    args, _ = parse_job_args(__doc__.split("\n")[0], argv=argv, add_arguments=_arguments)  # bad flags fail here
    from lilicorr.platform.corpus import is_corpus

    out = (ROOT / args.out).resolve()
    packaged = is_corpus(str(ROOT / load_config(args.preset, list(args.overrides)).data.output_dir))
    overrides = ([] if packaged else recipe(out)) + list(args.overrides)  # a packaged corpus: the preset is the recipe
    cfg = load_config(args.preset, overrides)  # the recipe with the user's overrides, checked before any work
    load_config(args.preset, overrides + args.head_set)
    heads = [h for h in args.heads.split(",") if h]
    unknown = [h for h in heads if h not in HEADS]
    if unknown:
        raise SystemExit(f"--heads: unknown {unknown}; known: {', '.join(HEADS)}")
    out.mkdir(parents=True, exist_ok=True)
    print("[ship] recipe: " + " ".join(overrides), flush=True)
    if args.head_set:
        print("[ship] heads phase also: " + " ".join(args.head_set), flush=True)
    command = " ".join(["jobs/train_shipped.py", *(sys.argv[1:] if argv is None else argv)])
    start = time.perf_counter()
    if not packaged:
        make_data(out, args.rows, args.preset)
    if cfg.train.feature_cache:  # else each step runs the target itself
        build_cache(overrides, args.preset, out / "cache.log")
    print(f"[ship] data + feature cache ready ({time.perf_counter() - start:.0f}s)", flush=True)
    if args.cont:  # each head continues its own shipped export
        starts = {name: (SHIP_DIR / name, _steps_taken(SHIP_DIR / name)) for name in heads}
    else:
        base_init = [f"train.init_from={(ROOT / args.base_init).resolve()}"] if args.base_init else []
        prior_steps = _steps_taken(ROOT / args.base_init) if args.base_init else 0
        if args.base_steps == 0 and args.base_init:  # the heads continue the export itself (its head too, same kind)
            base = {"export_dir": str((ROOT / args.base_init).resolve()), "steps": 0}
            print(f"[ship] base: --base-steps 0, the heads start from {args.base_init}", flush=True)
        else:
            base = run_train(out, "base", "none", overrides + [f"train.max_steps={args.base_steps}", *base_init],
                             args.preset)
        starts = {name: (base["export_dir"], base["steps"] + prior_steps) for name in heads}
    results = {}
    # one head after the other: two in-memory copies of the feature cache do not fit
    for name, (init, steps_before) in starts.items():
        results[name] = run_train(out, name, HEADS[name], overrides + args.head_set + [
            f"train.max_steps={args.steps}", f"train.init_from={init}"], args.preset)
        results[name]["steps"] += steps_before
    wall = time.perf_counter() - start
    for name, r in results.items():
        if args.ship and name in SHIPPED:
            print(f"[ship] shipped {ship(name, Path(r['export_dir']), r, wall, ROOT / cfg.data.output_dir, command)}",
                  flush=True)
    print(f"[ship] done in {wall:.0f}s", flush=True)


if __name__ == "__main__":
    main()
