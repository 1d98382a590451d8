"""The paper's ablations as named presets, everything else held fixed.

    distractor   Table 11: full loss vs no distractor penalty (λ = 0) at equal total reranker weight:
                 γ(1-μ)CE + γλ dist + γμ margin carries weight γ(1+λ); the ablated arm puts γ(1+λ) on CE.
    margin       Table 15: plain Eq. 7 (μ = 0) vs LiLiCorr + margin (μ = 0.5, ρ = loss.rho).
    decode-rule  Table 12: one trained checkpoint, greedy (Eq. 8) vs Viterbi (App. E) path selection,
                 scored on the same held-out rows (no training).

Training ablations run every arm with every `sweep.seeds` seed (no early stopping) as one Tune experiment
and report mean ± sample std per arm, the difference, and whether it exceeds two standard errors.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Optional

from lilicorr.config import Config, ConfigError
from lilicorr.platform.sweep.space import apply_overrides, sweep_name


def _num(x: float) -> str:
    return repr(round(float(x), 10))


def ablation_arms(cfg: Config, name: str) -> dict[str, dict[str, str]]:
    loss = cfg.loss
    if name == "distractor":
        if loss.lam <= 0:
            raise ConfigError("the distractor ablation needs loss.lam > 0 in the full arm")
        total = loss.gamma * (1.0 + loss.lam)
        return {"full": {"loss.gamma": _num(loss.gamma), "loss.lam": _num(loss.lam)},
                "no-distractor": {"loss.gamma": _num(total), "loss.lam": "0.0"}}
    if name == "margin":
        return {"plain": {"loss.mu": "0.0"}, "margin": {"loss.mu": "0.5", "loss.rho": _num(loss.rho)}}
    raise ConfigError(f"unknown training ablation {name!r}; known: distractor, margin")


def check_ablation(cfg: Config, name: str, export: Optional[str]) -> None:
    if cfg.head.kind != "lilicorr":
        raise ConfigError(f"the {name} ablation is about the LiLiCorr head; head.kind is {cfg.head.kind!r}")
    if name == "decode-rule":
        if not export or not (Path(export) / "config.json").is_file():
            raise ConfigError(f"--ablation decode-rule needs --export DIR with a trained export (got {export!r})")
        return
    if not cfg.sweep.seeds:
        raise ConfigError("an ablation needs sweep.seeds (at least one seed; three for a spread)")
    for overrides in ablation_arms(cfg, name).values():
        apply_overrides(cfg, overrides)


def _verdict(delta: float, se: float) -> str:
    return "measurable" if abs(delta) > 2 * se else "NOT measurable (within two standard errors)"


def difference_note(groups, first: str, second: str, metric: str) -> str:
    """Δ of the arms' means and whether it exceeds two standard errors of the difference."""
    by = {g.key.split(":")[0]: g for g in groups}
    if first not in by or second not in by:
        return "An arm has no completed trial: no comparison."
    a, b = by[first], by[second]
    delta = b.mean - a.mean
    rel = 100.0 * delta / a.mean if a.mean else math.nan
    if len(a.taus) > 1 and len(b.taus) > 1:
        se = math.sqrt(a.std ** 2 / len(a.taus) + b.std ** 2 / len(b.taus))
        return (f"Δ {metric} ({second} − {first}) = {delta:+.4f} ({rel:+.2f}%), standard error {se:.4f} "
                f"over {len(a.taus)}/{len(b.taus)} seeds: {_verdict(delta, se)}.")
    return f"Δ {metric} ({second} − {first}) = {delta:+.4f} ({rel:+.2f}%); one seed per arm, so no spread to judge it."


def run_ablation(cfg: Config, name: str, trainable=None):
    """Every arm x every seed, no early stopping; the table (mean ± std per arm, Δ) on a parent run."""
    from ray import tune

    from lilicorr.platform.sweep.report import finish_sweep
    from lilicorr.platform.sweep.results import group_over_seeds, records_from_grid
    from lilicorr.platform.sweep.runner import open_sweep, require_results, run_stage

    arms = ablation_arms(cfg, name)
    title = sweep_name(cfg, kind=f"ablation-{name}")
    cfg, sweep_dir, parent, max_t = open_sweep(cfg, title, "ablation", f"ablation {name}", trainable)
    print(f"[sweep] ablation {name}: arms {arms}, seeds {cfg.sweep.seeds}; parent MLflow run {parent}", flush=True)
    space = {"arms": arms, "arm": tune.grid_search(list(arms)), "seed": tune.grid_search(list(cfg.sweep.seeds))}
    grid = run_stage(cfg, sweep_dir, title, parent, "ab", space, trainable=trainable)
    records = records_from_grid(grid, "ab", cfg.sweep.metric, max_t)
    require_results(records, grid, cfg.sweep.metric)
    names = list(arms)
    note = difference_note(group_over_seeds(records), names[0], names[1], cfg.sweep.metric)
    keys = sorted({k for a in arms.values() for k in a})
    return finish_sweep(cfg, title, sweep_dir, parent, records, keys, note=note)


def decode_rule_ablation(cfg: Config, export: str) -> dict:
    """Table 12 on one checkpoint: per-row simulated τ on the held-out rows, greedy vs Viterbi."""
    import torch

    from lilicorr.models.export import read_meta
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target
    from lilicorr.platform.sweep.runs import log_parent_results, open_parent_run
    from lilicorr.platform.train.data import iter_rows_local, split_files
    from lilicorr.platform.train.validate import score_rows

    exp_cfg = read_meta(export).run_config()
    hf_model, _ = load_target(exp_cfg.target)
    joint = JointModel.load_exported(export, hf_model)
    files = split_files(cfg.data.output_dir, "heldout")
    if not files:
        raise FileNotFoundError(f"no held-out shards under {cfg.data.output_dir}/heldout")
    rows = list(iter_rows_local(files))
    per_rule: dict[str, list[tuple[float, float]]] = {}  # rule -> per scored row (τ, its weight)
    tau = "sim_acceptance_length"
    for rule in ("greedy", "viterbi"):
        joint.head.cfg.decode_rule = rule
        scores = [score_rows(joint, [row], exp_cfg.train.seq_len, exp_cfg.train.seed, torch.device("cpu"))
                  for row in rows]
        per_rule[rule] = [(s.sums[tau] / s.weights[tau], s.weights[tau]) for s in scores if s.rows and tau in s.weights]
    mean = {r: sum(t * w for t, w in v) / sum(w for _, w in v) for r, v in per_rule.items()}
    diffs = [v - g for (g, _), (v, _) in zip(per_rule["greedy"], per_rule["viterbi"])]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    delta = mean["viterbi"] - mean["greedy"]
    verdict = "one row: no spread" if math.isnan(se) else _verdict(delta, se)
    table = ("| held-out rows | greedy τ | exact (Viterbi) τ | Δ |\n|---|---|---|---|\n"
             f"| {len(diffs)} | {mean['greedy']:.4f} | {mean['viterbi']:.4f} | "
             f"{100 * delta / mean['greedy']:+.2f}% |\n\nPaired per-row Δ {delta:+.4f}, standard error {se:.4f}: {verdict}.\n")
    print(table, flush=True)
    title = sweep_name(cfg, kind="ablation-decode-rule")
    out_dir = Path(cfg.sweep.output_dir).resolve() / title
    parent = open_parent_run(cfg, title, out_dir, kind="ablation")
    (out_dir / "decode_rule_table.md").write_text(table)
    log_parent_results(cfg, parent, {"table": out_dir / "decode_rule_table.md"},
                       {"tau_greedy": mean["greedy"], "tau_viterbi": mean["viterbi"], "delta_se": se},
                       {"export": str(export)})
    return {"parent_run_id": parent, "tau_greedy": mean["greedy"], "tau_viterbi": mean["viterbi"],
            "delta": delta, "delta_se": se, "rows": len(diffs), "table": str(out_dir / "decode_rule_table.md")}
