"""Joint training of drafter + head on Ray Train with DeepSpeed: the driver and `train(cfg)`.

    cfg = load_config("smollm2-135m", ["head.kind=none", "data.output_dir=outputs/regenerated"])
    result = train(cfg)   # TrainResult(export_dir, mlflow_run_id, steps, metrics, checkpoint_dir, wall_s)
    result.export_dir     # drafter + head (safetensors + config.json) that jobs/generate.py loads

`train.max_steps`, when set, is the exact number of optimizer steps (data cycled as needed), so heads
trained with the same data, steps, batch and seed are comparable. Outputs under `train.output_dir`:
`ray/` (Ray Train run: resumable checkpoints, see train/checkpoint.py) and `export/`.

`train` reads the regenerated shards as Ray Data datasets, runs `TorchTrainer` with
`train.num_workers` workers (GPUs when `train.use_gpu`, else CPU processes on gloo), each stepping a
DeepSpeed engine (train/worker.py), and restarts failed workers from the last checkpoint up to
`train.max_failures` times. It logs to the MLflow run it opens (or `mlflow_run_id`'s), copies the final
export to `train.output_dir/export`, and logs that export as an artifact. `train.runner=local` runs the same loop
in this process instead (train/local.py: no Ray or DeepSpeed; untracked where MLflow is not installed).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from lilicorr.config import Config
from lilicorr.platform.train.checkpoint import EXPORT_SUBDIR, read_train_state
from lilicorr.platform.train.data import COLUMNS, count_rows, ray_datasets, require_train_files, split_files
from lilicorr.platform.train.schedule import plan_steps


@dataclass
class TrainResult:
    export_dir: str  # final drafter + head export (train.output_dir/export)
    mlflow_run_id: Optional[str]
    steps: int  # optimizer steps the final checkpoint has taken
    metrics: dict[str, float] = field(default_factory=dict)  # last reported (val_* and train_*)
    checkpoint_dir: str = ""  # the final resumable Ray Train checkpoint
    wall_s: float = 0.0


# Settings that do not change what is trained: a rerun that differs only in these continues the same run.
_NOT_FINGERPRINTED = {"train": {"max_failures", "fail_at_step", "log_every", "output_dir", "checkpoint_every",
                                "validate_every", "val_max_rows", "val_batch_size", "cpu_threads"},
                      "tracking": None, "demo": None, "eval": None, "engine": None}


def run_name(cfg: Config) -> str:
    """The Ray Train run name: head kind + a hash of the settings that shape training.

    Ray Train V2 restores a run from its storage folder when one with the same name exists (so a
    retried job resumes from its last checkpoint). Hashing the config makes that happen only for the
    same training setup; a changed learning rate or step count starts a fresh run beside the old one.
    """
    import hashlib
    import json

    d = cfg.to_dict()
    for section, fields in _NOT_FINGERPRINTED.items():
        if fields is None:
            d.pop(section, None)
        else:
            d[section] = {k: v for k, v in d[section].items() if k not in fields}
    digest = hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"train-{cfg.head.kind}-{digest}"


def ensure_ray(log_to_driver: bool = True) -> None:
    """Ray for training, sweeps and evaluation (log_to_driver=False: the workers' prints stay in Ray's logs)."""
    import ray

    if not ray.is_initialized():
        # Inside `ray job submit` RAY_ADDRESS names the cluster; otherwise start a local one.
        ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"address": "local", "include_dashboard": False}),
                 log_to_driver=log_to_driver)


def build_trainer(cfg: Config, loop_config: dict, datasets: dict, callbacks: tuple = ()):
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from lilicorr.platform.train.worker import train_loop_per_worker

    storage = Path(cfg.train.output_dir).resolve() / "ray"
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu),
        # gloo on CPU; NCCL on GPU (Ray's default there).
        torch_config=TorchConfig(backend="nccl" if cfg.train.use_gpu else "gloo"),
        run_config=RunConfig(
            name=run_name(cfg), storage_path=str(storage),
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=list(callbacks),  # e.g. the sweep's report forwarding to Ray Tune
        ),
        datasets=datasets,
        # The training set is split equally (every rank takes the same steps). The held-out set is not:
        # an equal split drops the remainder rows, so each worker sees it whole and scores the rows it
        # owns by id (train_validate.owns_row): every held-out row is scored exactly once.
        dataset_config=DataConfig(datasets_to_split=["train"]),
    )


def resolve_inputs(cfg: Config) -> None:
    """The config's paths made absolute here, on the driver, in place (a Ray worker's working directory is not the
    driver's), and a missing export refused now, not in a worker after the feature cache: load_config did it
    already; again here for a config changed in code since (sweeps, tests). lilicorr/config/paths.py has the rules."""
    from lilicorr.config.paths import resolve_paths

    resolve_paths(cfg)


def train(cfg: Config, mlflow_run_id: Optional[str] = None, track: bool = True, callbacks: tuple = (),
          register: bool = True) -> TrainResult:
    """Train drafter + head as `cfg` says; returns where the export is, the MLflow run, steps, metrics.

    `callbacks`: Ray Train UserCallbacks for the run (platform/sweep forwards reports to Ray Tune with one).
    `register=False`: no model version (sweep trials; the sweep registers its best trial's export)."""
    from lilicorr.config.rules import check_rules

    start = time.perf_counter()
    check_rules(cfg)  # again: sweeps and tests change configs in code after load_config
    resolve_inputs(cfg)  # before the feature cache and Ray: the workers read these paths
    files = require_train_files(cfg.data.output_dir)
    plan = plan_steps(cfg, count_rows(files), cfg.train.num_workers)
    local = cfg.train.runner == "local"
    if local and track:
        try:
            importlib.import_module("mlflow")
        except ImportError:
            print("[train] mlflow is not installed here: this train.runner=local run is not tracked (progress lines "
                  "and the checkpoints' metrics.json hold its figures)", flush=True)
            track = False
    features, datasets = None, {}  # local: train/local.py reads the shards (rules.py refuses the feature cache there)
    if not local:
        ensure_ray()
        data_dir, columns = cfg.data.output_dir, COLUMNS
        if cfg.train.feature_cache:  # the shards with the target's states beside each row
            from lilicorr.platform.train.features import FEATURE_COLUMNS, build_feature_cache, read_manifest

            data_dir = build_feature_cache(cfg, log=lambda m: print(f"[train] {m}", flush=True))
            features, columns = read_manifest(data_dir), COLUMNS + FEATURE_COLUMNS
        datasets = ray_datasets(data_dir, in_memory=not cfg.train.use_gpu, columns=columns)
    print(f"[train] head {cfg.head.kind}: {plan.total_steps} steps of {cfg.train.global_batch_size} rows "
          f"({plan.world_size} workers x {plan.micro_batch} rows x {plan.grad_accum} accumulated), "
          f"{plan.steps_per_epoch} steps/epoch, warmup {plan.warmup_steps}", flush=True)

    with _mlflow_run(cfg, mlflow_run_id, track) as (run_id, uri):
        has_heldout = bool(split_files(cfg.data.output_dir, "heldout")) if local else "heldout" in datasets
        loop_config = {"config": cfg.to_dict(), "plan": asdict(plan), "has_heldout": has_heldout,
                       "features": features, "draft_vocab": _draft_vocab(cfg, files),
                       "mlflow": {"run_id": run_id, "tracking_uri": uri} if run_id else None}
        if local:
            from lilicorr.platform.train.local import run_local

            checkpoint_path, reported = run_local(cfg, loop_config)
            checkpoint = contextlib.nullcontext(str(checkpoint_path))
        else:
            result = build_trainer(cfg, loop_config, datasets, callbacks).fit()
            if result.error is not None:
                raise result.error
            if result.checkpoint is None:
                raise RuntimeError("training finished without a checkpoint")
            checkpoint, checkpoint_path, reported = result.checkpoint.as_directory(), result.checkpoint.path, result.metrics
        export_dir = Path(cfg.train.output_dir).resolve() / EXPORT_SUBDIR
        with checkpoint as d:
            steps = read_train_state(d)["step"]
            shutil.rmtree(export_dir, ignore_errors=True)
            shutil.copytree(Path(d) / EXPORT_SUBDIR, export_dir)
        if not cfg.drafter.draft_vocab:  # what engine.draft_vocab restricts a full-vocabulary drafter by
            from lilicorr.platform.train.data import write_export_ranking

            write_export_ranking(files, str(export_dir))
        metrics = {k: float(v) for k, v in (reported or {}).items() if isinstance(v, (int, float))}
        wall = time.perf_counter() - start
        if run_id:
            import mlflow

            from lilicorr.platform.tracking import register_export, registered_name, write_lineage

            client = mlflow.tracking.MlflowClient(tracking_uri=uri)
            write_lineage(export_dir, run_id, tracking_uri=uri)  # evaluations of this export link back to this run
            client.log_artifacts(run_id, str(export_dir), "export")
            try:  # models:/<preset>-<head>@newest names this export wherever a checkpoint folder is accepted
                if not register:
                    raise RuntimeError("register=False (a sweep trial)")
                mv = register_export(run_id, registered_name(cfg, cfg.head.kind), uri=uri)
                print(f"[train] registered models:/{mv.name}@newest (version {mv.version})", flush=True)
            except Exception as e:  # noqa: BLE001 — a store without a registry keeps the run's artifact
                print(f"[train] export not registered ({type(e).__name__}: {e})", flush=True)
            client.log_metric(run_id, "train_wall_s", wall)
            _log_learning_curve(client, run_id, cfg)
            client.set_tag(run_id, "checkpoint_dir", str(checkpoint_path))
    print(f"[train] done: {steps} steps in {wall:.1f} s; export {export_dir}", flush=True)
    return TrainResult(export_dir=str(export_dir), mlflow_run_id=run_id, steps=steps, metrics=metrics,
                       checkpoint_dir=str(checkpoint_path), wall_s=wall)


def _draft_vocab(cfg: Config, files: list[str]) -> Optional[list[int]]:
    """drafter.draft_vocab's token ids from the training shards (None: full vocabulary). Workers use them
    unless the run starts from an export that has its own (train.init_from)."""
    if not cfg.drafter.draft_vocab:
        return None
    from lilicorr.platform.train.data import draft_vocab_from_shards

    ids = draft_vocab_from_shards(files, cfg.drafter.draft_vocab)
    print(f"[train] draft vocabulary: the {len(ids)} most frequent supervised tokens of the training shards", flush=True)
    return ids


@contextlib.contextmanager
def _mlflow_run(cfg: Config, run_id: Optional[str], track: bool):
    """(run id, absolute tracking URI): the given run, a new `train` run, or (None, None) untracked."""
    if not track:
        yield None, None
        return
    from lilicorr.platform.tracking import absolute_uri, start_run, tracking_uri

    uri = absolute_uri(tracking_uri(cfg))
    if run_id is not None:
        yield run_id, uri
        return
    from lilicorr.platform.tracking import check_cluster_store, data_lineage, parent_run_id

    check_cluster_store(uri)  # workers on other nodes log here: a per-machine store fails clearly, up front
    with start_run(cfg, "train", name_parts=[cfg.head.kind], resume_key=f"{run_name(cfg)}@{parent_run_id()}",
                   extra_tags={"head": cfg.head.kind, **data_lineage(cfg.data.output_dir)}) as run:
        yield run.info.run_id, uri


def _log_learning_curve(client, run_id: str, cfg: Config) -> None:
    """Validation τ (simulated acceptance on held-out rows) against training tokens, as a PNG artifact."""
    from lilicorr.platform.train.curves import plot_curves, read_curve

    points = read_curve(client, run_id)
    if not points:
        return
    fig = plot_curves({"": points}, f"{cfg.preset} head={cfg.head.kind}")
    client.log_figure(run_id, fig, "learning_curve.png")
    import matplotlib.pyplot as plt

    plt.close(fig)
