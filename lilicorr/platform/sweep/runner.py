"""Run a sweep: stage one (grid or random search, ASHA on the training step), stage two (the best configs
re-run with each seed, no early stopping), then tables, the τ figure and the best config on the parent run.

    outcome = run_sweep(load_config("smollm2-135m", ["data.output_dir=outputs/regenerated"]))

Each stage is one Tune experiment under `<sweep.output_dir>/<name>/tune/<stage>`. Rerunning the same
command after an interruption restores it with `Tuner.restore`: finished trials keep their results and
are not run again, unfinished ones restart (and their Ray Train run resumes from its last checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from lilicorr.config import Config
from lilicorr.platform.sweep.results import TrialRecord, records_from_grid
from lilicorr.platform.sweep.space import parse_space, sweep_name, tune_space


TRIAL_MEMORY = 2 ** 20  # bytes of Ray's memory resource a trial reserves (not a limit on its process)


@dataclass
class SweepOutcome:
    name: str
    sweep_dir: str
    parent_run_id: str
    records: list[TrialRecord]
    table: str = ""  # markdown, as logged to the parent run
    best_config: Optional[str] = None  # file that `jobs/train.py --config FILE` accepts
    best_run_id: Optional[str] = None
    files: dict[str, str] = field(default_factory=dict)


def absolutized(cfg: Config) -> Config:
    """Paths and the tracking URI made absolute: Tune trials and Train workers run with another cwd."""
    from lilicorr.platform.train.driver import resolve_inputs
    from lilicorr.platform.tracking import absolute_uri, tracking_uri

    out = Config.from_dict(cfg.to_dict())
    out.preset = cfg.preset
    out.tracking.tracking_uri = absolute_uri(tracking_uri(cfg))  # None: $MLFLOW_TRACKING_URI or the default
    resolve_inputs(out)  # every other path (load_config resolved them; this config may have changed since)
    return out


def total_steps(cfg: Config) -> int:
    from lilicorr.platform.train.data import count_rows, require_train_files
    from lilicorr.platform.train.schedule import plan_steps

    return plan_steps(cfg, count_rows(require_train_files(cfg.data.output_dir)), cfg.train.num_workers).total_steps


def open_sweep(cfg: Config, name: str, kind: str, job: str, trainable: Optional[Callable]) -> tuple:
    """(config with absolute paths, sweep folder, parent run, training steps of a trial), with the corpus checked
    first (real trials are scored on it: before Ray and MLflow start), then the parent run opened and Ray up."""
    from lilicorr.platform.sweep.preflight import require_validation_corpus
    from lilicorr.platform.sweep.runs import open_parent_run
    from lilicorr.platform.train.driver import ensure_ray

    cfg = absolutized(cfg)
    if trainable is None:
        require_validation_corpus(cfg, job)
    sweep_dir = Path(cfg.sweep.output_dir) / name
    parent = open_parent_run(cfg, name, sweep_dir, kind=kind)
    ensure_ray()
    return cfg, sweep_dir, parent, total_steps(cfg) if trainable is None else (cfg.train.max_steps or 1)


def run_stage(cfg: Config, sweep_dir: Path, name: str, parent: str, stage: str, param_space: dict, *,
              num_samples: int = 1, asha_max_t: Optional[int] = None, trainable: Optional[Callable] = None):
    """One Tune experiment (restored when an earlier attempt left one); returns its ResultGrid.

    `param_space` holds what varies (overrides, seed, arm); what every trial shares (base config, sweep folder,
    parent run) goes through `tune.with_parameters`, so it stays out of Tune's tables."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from lilicorr.platform.sweep.trial import run_trial

    sw = cfg.sweep
    # The trial reserves no CPU: its Train workers take the cores. Tune refuses an all-zero request, so
    # the trial holds 1 MiB of Ray's `memory` resource instead (present on every node).
    context = {"base": cfg.to_dict(), "stage": stage, "sweep_dir": str(sweep_dir), "sweep": name,
               "parent_run_id": parent}
    fn = tune.with_resources(tune.with_parameters(trainable or run_trial, **context),
                             {"cpu": 0, "memory": TRIAL_MEMORY})
    storage = sweep_dir / "tune"
    path = storage / stage
    if tune.Tuner.can_restore(str(path)):
        print(f"[sweep] {stage}: resuming {path} (finished trials are kept)", flush=True)
        tuner = tune.Tuner.restore(str(path), trainable=fn, resume_unfinished=True, resume_errored=True)
    else:
        scheduler = None
        if asha_max_t is not None:
            grace = sw.grace_period or cfg.train.validate_every
            # max_t one past the last step: ASHA stops a trial that reaches max_t at once, which would kill
            # it before train() exports and closes its run; finishing trials must end on their own.
            scheduler = ASHAScheduler(time_attr="step", max_t=asha_max_t + 1, grace_period=min(grace, asha_max_t),
                                      reduction_factor=sw.reduction_factor)
        tuner = tune.Tuner(
            fn, param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=sw.metric, mode="max", scheduler=scheduler, num_samples=num_samples,
                # The concurrency limit goes to the generator itself: TuneConfig.max_concurrent_trials is
                # ignored when a search_alg instance is given.
                search_alg=BasicVariantGenerator(max_concurrent=sw.max_concurrent_trials, random_state=sw.search_seed),
                trial_dirname_creator=lambda t: t.trial_id),
            run_config=tune.RunConfig(name=stage, storage_path=str(storage), verbose=1,
                                      failure_config=tune.FailureConfig(max_failures=0)))
    return tuner.fit()


def require_results(records: list[TrialRecord], grid, metric: str) -> None:
    """Raise (with the first trial error) when no trial reported the objective at all."""
    if any(r.tau is not None for r in records):
        return
    errors = [r.error for r in grid if r.error is not None]
    raise RuntimeError(f"no trial reported {metric} ({len(records)} trials, {len(errors)} failed); first error: "
                       f"{errors[0] if errors else 'none'}")


def stage_two_configs(records: list[TrialRecord], top_k: int) -> list[dict[str, str]]:
    """The `top_k` best distinct configs among stage one's completed trials (by final τ)."""
    from lilicorr.platform.sweep.results import ranked

    out: list[dict[str, str]] = []
    for r in ranked(records):
        if r.status != "completed" or r.overrides in out:
            continue
        out.append(dict(r.overrides))
        if len(out) == top_k:
            break
    return out


def run_sweep(cfg: Config, trainable: Optional[Callable] = None) -> SweepOutcome:
    """Stage one, stage two and the report; `trainable` replaces the training trial (tests)."""
    from ray import tune

    from lilicorr.platform.sweep.report import finish_sweep

    dims = parse_space(cfg)
    name = sweep_name(cfg)
    cfg, sweep_dir, parent, max_t = open_sweep(cfg, name, "sweep", "sweep", trainable)
    print(f"[sweep] {name}: {cfg.sweep.search} search over {', '.join(d.key for d in dims)}; "
          f"parent MLflow run {parent}; outputs {sweep_dir}", flush=True)
    space = {"overrides": tune_space(dims, cfg.sweep.search)}
    grid = run_stage(cfg, sweep_dir, name, parent, "s1", space, num_samples=cfg.sweep.num_samples,
                     asha_max_t=max_t if cfg.sweep.scheduler == "asha" else None, trainable=trainable)
    records = records_from_grid(grid, "s1", cfg.sweep.metric, max_t)
    require_results(records, grid, cfg.sweep.metric)
    for r in records:  # stage one ran every trial with the base seed: one sample of each config
        r.overrides.setdefault("train.seed", str(cfg.train.seed))

    seeds = [s for s in cfg.sweep.seeds if s != cfg.train.seed]
    best = stage_two_configs(records, cfg.sweep.top_k) if cfg.sweep.seeds else []
    if best and seeds:
        configs = [{k: v for k, v in c.items() if k != "train.seed"} for c in best]
        space2 = {"overrides": tune.grid_search(configs), "seed": tune.grid_search(seeds)}
        grid2 = run_stage(cfg, sweep_dir, name, parent, "s2", space2, trainable=trainable)
        records += records_from_grid(grid2, "s2", cfg.sweep.metric, max_t)
    return finish_sweep(cfg, name, sweep_dir, parent, records, [d.key for d in dims])
