"""The end of a sweep: comparison tables (grouped over seeds), the τ figure, the best trial tagged and its
config written as a `jobs/train.py --config FILE` file, all logged to the sweep's parent MLflow run."""

from __future__ import annotations

import math
from pathlib import Path

from lilicorr.config import Config
from lilicorr.config.overrides import write_config_file
from lilicorr.platform.sweep.results import (TrialRecord, fmt, group_over_seeds, groups_table, ranked, tau_figure,
                                             trials_table, write_results)

# Settings that say where a trial ran, not what it trained: left out of the best-config file.
_NOT_IN_BEST = ("train.output_dir",)


def spread_note(records: list[TrialRecord], groups) -> tuple[str, dict[str, float]]:
    """Is the spread over configs larger than the spread over seeds? Said in numbers, not guessed.

    A search compares its stage-one trials (one seed each); an ablation (every arm over the same seeds, no
    stage one) compares the arms' means over seeds.
    """
    done = [r.tau for r in records if r.stage == "s1" and r.status == "completed" and r.tau is not None]
    seeded = [g for g in groups if len(g.taus) > 1]
    stats: dict[str, float] = {}
    what = "final τ over configs (stage one, one seed)"
    if len(done) > 1:
        stats["config_range"] = max(done) - min(done)
    elif len(seeded) > 1:
        means = [g.mean for g in seeded]
        stats["config_range"] = max(means) - min(means)
        what = "mean τ over seeds between configs"
    if seeded:
        stats["seed_std"] = max(g.std for g in seeded)
    if "config_range" in stats and "seed_std" in stats:
        verdict = ("larger than" if stats["config_range"] > 2 * stats["seed_std"] else "within")
        text = (f"Spread of {what}: {stats['config_range']:.4f}; largest "
                f"sample std over seeds: {stats['seed_std']:.4f}; the config spread is {verdict} two seed "
                f"standard deviations, so config differences are "
                f"{'measurable' if verdict == 'larger than' else 'NOT measurable'} at this scale.")
    elif seeded:
        text = (f"One config repeated over seeds (largest sample std {stats['seed_std']:.4f}); nothing to compare "
                "it with.")
    else:
        text = "No seed repeats: the spread over seeds is unknown, so differences between configs are unqualified."
    return text, stats


def register_best(cfg: Config, run_id: str) -> str:
    """The best trial's export as a model version with alias `sweep-best` (trials themselves register none)."""
    from lilicorr.platform.sweep.runs import _client
    from lilicorr.platform.tracking import register_export, registered_name

    if not any(a.path == "export" for a in _client(cfg).list_artifacts(run_id)):
        return "none (the best trial logged no export)"
    name = registered_name(cfg, cfg.head.kind)
    mv = register_export(run_id, name, alias="sweep-best", uri=cfg.tracking.tracking_uri)
    print(f"[sweep] best trial's export registered as models:/{name}@sweep-best (version {mv.version})", flush=True)
    return f"models:/{name}@sweep-best"


def finish_sweep(cfg: Config, name: str, sweep_dir: Path, parent: str, records: list[TrialRecord],
                 keys: list[str], note: str = ""):
    from lilicorr.platform.sweep.runner import SweepOutcome
    from lilicorr.platform.sweep.runs import close_stopped_children, log_parent_results, _client
    from lilicorr.platform.sweep.space import apply_overrides

    metric = cfg.sweep.metric
    stopped = close_stopped_children(cfg, parent)
    groups = group_over_seeds(records)
    spread, stats = spread_note(records, groups)
    note = "\n\n".join(x for x in (note, spread) if x)
    table = (f"## {name}: trials\n\n{trials_table(records, [*keys, 'train.seed'], metric)}\n\n"
             f"## grouped over seeds (completed trials)\n\n{groups_table(groups, metric)}\n\n{note}\n")
    report_dir = sweep_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    files = {"table": report_dir / "sweep_table.md", "results": write_results(records, report_dir / "results.json")}
    files["table"].write_text(table)
    files["figure"] = tau_figure(records, groups, keys, metric, report_dir / "tau_vs_weights.png")

    # Best: the config with the highest mean over the most seeds (groups come best mean first; max keeps the
    # first of equals), its best trial the one tagged.
    best_group = max(groups, key=lambda g: len(g.taus), default=None)
    best_trial = None
    tags = {"n_trials": str(len(records)), "stopped_early": str(stopped)}
    metrics: dict[str, float] = {"n_trials": len(records), **stats,
                                 "n_completed": sum(r.status == "completed" for r in records)}
    if best_group is not None:
        best_trial = max((r for r in records if r.run_id in best_group.run_ids and r.tau is not None),
                         key=lambda r: r.tau, default=None)
        best_cfg = apply_overrides(cfg, best_group.overrides)
        best_cfg.train.seed = cfg.train.seed
        files["best_config"] = write_config_file(
            best_cfg, report_dir / "best_config.yaml", skip=_NOT_IN_BEST + tuple(k for k in cfg.flat() if k.startswith("sweep.")),
            header=f"best config of sweep {name}: {best_group.key}\n{metric} {best_group.mean:.4f}"
                   f" ± {fmt(best_group.std)} over {len(best_group.taus)} seed(s)\n"
                   f"python jobs/train.py --preset {cfg.preset} --config {report_dir / 'best_config.yaml'}")
        metrics[f"best_{metric}"] = best_group.mean
        if not math.isnan(best_group.std):
            metrics[f"best_{metric}_std"] = best_group.std
        tags.update({"best_config": best_group.key, "best_run_id": best_trial.run_id if best_trial else ""})
    elif ranked(records):
        best_trial = ranked(records)[0]
    if best_trial is not None and best_trial.run_id:
        _client(cfg).set_tag(best_trial.run_id, "best", "true")
        tags["best_model"] = register_best(cfg, best_trial.run_id)
    rows = [{"config": g.key, "mean": g.mean, "std": g.std, "n": len(g.taus), "seeds": g.seeds} for g in groups]
    log_parent_results(cfg, parent, files, metrics, tags, rows)
    print(table, flush=True)
    return SweepOutcome(name=name, sweep_dir=str(sweep_dir), parent_run_id=parent, records=records, table=table,
                        best_config=str(files["best_config"]) if "best_config" in files else None,
                        best_run_id=best_trial.run_id if best_trial else None,
                        files={k: str(v) for k, v in files.items()})
