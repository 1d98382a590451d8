"""MLflow tracking: one helper every job uses.

Default store: `sqlite:///mlruns.db` plus artifacts in `mlartifacts/` beside it; `MLFLOW_TRACKING_URI`
(or `tracking.tracking_uri`) points elsewhere, e.g. a team server. Every run records the resolved config
as params and tags the git commit (MLflow's standard `mlflow.source.git.commit`), preset and job.

    with start_run(cfg, "train", name_parts=["lilicorr"]) as run:   # "train-lilicorr-smollm2-135m max_steps=60"
        mlflow.log_metric("loss", 1.0, step=0)

Pipelines (demo, evaluation, sweep): the parent opens its run and hands its id to stages through
`child_env(run)` (`LILICORR_PARENT_RUN_ID` + an absolute tracking URI); a stage's `start_run` then
nests under it, in the parent's experiment. `resume_key`: a retried job whose earlier attempt did not
finish continues that run instead of opening a second one. Lineage: `lilicorr.source_run_id` (the run
that made a checkpoint or a corpus), `lilicorr.data_fingerprint` (a regenerated corpus's manifest).
Exports: `register_export` makes a model version; `resolve_checkpoint("models:/NAME@ALIAS")` gives a
local folder wherever a checkpoint folder is accepted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator, Optional

from lilicorr.config import Config
from lilicorr.platform.tracking_ui import (EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, REPO_ROOT,  # noqa: F401 (re-exported)
                                           SOURCE_NAME_TAG, source_tags, ui_link)

DEFAULT_URI = "sqlite:///mlruns.db"
DEFAULT_ARTIFACTS = "mlartifacts"
GIT_TAG = "mlflow.source.git.commit"  # MLflow's standard tag (the UI links it)
PARENT_TAG = "mlflow.parentRunId"
PARENT_ENV = "LILICORR_PARENT_RUN_ID"
RUN_KEY_TAG = "lilicorr.run_key"
SOURCE_RUN_TAG = "lilicorr.source_run_id"
FINGERPRINT_TAG = "lilicorr.data_fingerprint"
# The corpus a job reads (or writes) is logged as a run input in this context (tracking_inputs.py).
CORPUS_CONTEXT = {"train": "training", "regenerate": "regenerated"}
# Overrides that never tell runs apart (paths, store, logging cadence).
_NAME_IGNORED = ("output_dir", "tracking.", "log_every", "checkpoint_every", "validate_every", "max_failures")


class TrackingStoreError(RuntimeError):
    """A tracking store that cannot serve this job (a per-machine store on a multi-node cluster)."""


def tracking_uri(cfg: Config | None = None) -> str:
    if cfg is not None and cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI)


def absolute_uri(uri: str) -> str:
    """A relative sqlite URI made absolute, so processes with another cwd write into the same store."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def artifact_location(uri: str) -> Optional[str]:
    """Where a new experiment keeps artifacts: `mlartifacts/` beside a sqlite database (absolute).

    MLflow's own default for a sqlite store is `./mlruns` in the cwd of whichever process creates the
    experiment: under `ray job submit` that is a temporary copy, and the artifacts are lost.
    """
    if uri.startswith("sqlite:///"):
        db = Path(absolute_uri(uri)[len("sqlite:///"):])
        return (db.parent / DEFAULT_ARTIFACTS).resolve().as_uri()
    return None  # file stores keep artifacts inside; servers choose their own


def check_cluster_store(uri: str, num_nodes: Optional[int] = None) -> None:
    """Fail with a clear message when a per-machine store meets a multi-node Ray cluster.

    Workers on other nodes would log into an empty database of their own (the first metric fails the
    run). num_nodes=None: count the alive nodes of the connected Ray cluster (1 when Ray is not up).
    """
    local = uri.startswith(("sqlite:", "file:")) or "://" not in uri  # one machine's files, not a tracking server
    if not local or os.environ.get("LILICORR_SHARED_STORE") == "1":
        return
    if num_nodes is None:
        try:
            import ray

            num_nodes = len([n for n in ray.nodes() if n.get("Alive")]) if ray.is_initialized() else 1
        except ImportError:
            num_nodes = 1
    if num_nodes > 1:
        raise TrackingStoreError(
            f"MLflow store {uri!r} is a file/sqlite store on this machine, but the Ray cluster has {num_nodes} "
            "nodes: workers elsewhere would log into an empty store of their own. Start a tracking server and "
            "pass tracking.tracking_uri=http://HOST:5000 (or MLFLOW_TRACKING_URI), or, if this path is on a "
            "volume every node mounts, set LILICORR_SHARED_STORE=1.")


def git_commit() -> str:
    """The commit of the code being run ('unknown' outside a checkout, e.g. a Ray working_dir copy)."""
    if os.environ.get("LILICORR_GIT_COMMIT"):
        return os.environ["LILICORR_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def setup(cfg: Config):
    """Point MLflow at the store and select the experiment; returns the mlflow module."""
    import mlflow

    uri = absolute_uri(tracking_uri(cfg))
    mlflow.set_tracking_uri(uri)
    name = cfg.tracking.experiment
    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        try:
            mlflow.create_experiment(name, artifact_location=artifact_location(uri),
                                     tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except mlflow.exceptions.MlflowException:
            if mlflow.get_experiment_by_name(name) is None:  # not a lost race with another process
                raise
    elif EXPERIMENT_KIND_TAG not in exp.tags:  # made before the tag (or by hand): opens on runs too; a kind
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)  # set by a user stays
    mlflow.set_experiment(name)
    return mlflow


def run_tags(cfg: Config, job: str) -> dict[str, str]:
    """What every run of a job is tagged with: the commit (MLflow's tag and a plain one), preset, job, Source."""
    commit = git_commit()
    return {"git_commit": commit, GIT_TAG: commit, "preset": cfg.preset, "job": job, **source_tags(job)}


def log_config(client, run_id: str, cfg: Config, logged=()) -> None:
    """The resolved config as params (but those in `logged`) and as config.json."""
    from mlflow.entities import Param

    params = [Param(k, str(v) if len(str(v)) <= 500 else str(v)[:497] + "...")  # MLflow caps param values
              for k, v in cfg.flat().items() if k not in logged]
    for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
        client.log_batch(run_id, params=params[i:i + 100])
    client.log_text(run_id, cfg.to_json(), "config.json")


def key_overrides(cfg: Config) -> list[str]:
    """The settings where `cfg` departs from its preset, as short `field=value` (paths and store left out)."""
    from lilicorr.config import PRESETS, load_config

    if cfg.preset not in PRESETS:
        return []
    base = load_config(cfg.preset).flat()
    out = [f"{key.split('.', 1)[-1]}={value}" for key, value in cfg.flat().items()
           if key in base and base[key] != value and not any(s in key for s in _NAME_IGNORED)]
    return out[:4]  # a run name stays readable


def make_run_name(cfg: Config, job: str, parts: list[str] = ()) -> str:
    """`job-part-...-preset key=value ...`: names that tell two train runs of different heads apart."""
    head = "-".join([job, *[str(p) for p in parts if p], cfg.preset])
    extra = [o for o in key_overrides(cfg) if o.split("=", 1)[1] not in {str(p) for p in parts}]
    return head + (" " + " ".join(extra) if extra else "")


def parent_run_id() -> Optional[str]:
    return os.environ.get(PARENT_ENV) or None


def child_env(run) -> dict[str, str]:
    """Environment for a stage run as a subprocess: it nests under `run` in the same store."""
    import mlflow

    return {PARENT_ENV: run.info.run_id, "MLFLOW_TRACKING_URI": absolute_uri(mlflow.get_tracking_uri()),
            "LILICORR_GIT_COMMIT": git_commit()}


def _unfinished_run(mlflow, experiment_id: str, key: str) -> Optional[str]:
    runs = mlflow.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                              output_format="list", order_by=["attributes.start_time DESC"])
    return next((r.info.run_id for r in runs if r.info.status != "FINISHED"), None)


def run_key(cfg: Config, job: str, extra: str = "") -> str:
    """A fingerprint of (job, resolved config, parent, extra): equal for a retry of the same job."""
    text = json.dumps([job, cfg.to_dict(), parent_run_id(), extra], sort_keys=True, default=str)
    return f"{job}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def start_run(cfg: Config, job: str, extra_tags: dict[str, str] | None = None, name_parts: list[str] = (),
              resume_key: Optional[str] = None) -> Iterator:
    """An MLflow run with the resolved config as params and git/preset/job tags.

    It nests under $LILICORR_PARENT_RUN_ID, in the parent's experiment, when that is set. resume_key:
    continue the newest unfinished run carrying this key (a retried job).
    """
    from lilicorr.platform.tracking_inputs import log_corpus

    parent = parent_run_id()
    mlflow = setup(cfg)
    experiment_id = (mlflow.get_run(parent).info.experiment_id if parent else
                     mlflow.get_experiment_by_name(cfg.tracking.experiment).experiment_id)
    resumed = _unfinished_run(mlflow, experiment_id, resume_key) if resume_key else None
    if resumed and parent == resumed:  # a pipeline closing the run it opened (open_parent)
        parent = None
    tags = {**run_tags(cfg, job), **(extra_tags or {})}
    if parent:
        tags[PARENT_TAG] = parent
    if resume_key:
        tags[RUN_KEY_TAG] = resume_key
    if resumed:
        ctx = mlflow.start_run(run_id=resumed)
    else:
        ctx = mlflow.start_run(run_name=make_run_name(cfg, job, list(name_parts)), tags=tags,
                               experiment_id=experiment_id)
    with ctx as run:
        client, run_id = mlflow.MlflowClient(), run.info.run_id
        if resumed:
            mlflow.set_tags({**tags, "lilicorr.resumed": "true"})
        log_config(client, run_id, cfg, logged=mlflow.get_run(run_id).data.params if resumed else ())
        context = CORPUS_CONTEXT.get(job)
        logged_corpus = bool(context) and log_corpus(client, run_id, cfg.data.output_dir, context)
        yield run
        if context and not logged_corpus:  # a regeneration's corpus exists only now
            log_corpus(client, run_id, cfg.data.output_dir, context)


def open_parent(cfg: Config, job: str, name_parts: list[str] = ()) -> str:
    """Open a pipeline's run now (left RUNNING) and export it to stage subprocesses (`child_env` in
    os.environ); returns the key that closes it later: `with start_run(cfg, job, resume_key=key)`."""
    import time

    mlflow = setup(cfg)
    key = run_key(cfg, job, extra=f"{os.getpid()}-{time.time()}")
    exp = mlflow.get_experiment_by_name(cfg.tracking.experiment).experiment_id
    tags = {**run_tags(cfg, job), RUN_KEY_TAG: key}
    if parent_run_id():
        tags[PARENT_TAG] = parent_run_id()
    run = mlflow.MlflowClient().create_run(exp, run_name=make_run_name(cfg, job, list(name_parts)), tags=tags)
    os.environ.update(child_env(run))
    return key


def fingerprint_hash(fingerprint) -> str:
    return hashlib.sha1(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_lineage(folder: str | Path, run_id: Optional[str], **extra) -> None:
    """`lineage.json` in an output folder (a corpus, an export): the MLflow run that made it."""
    if run_id:
        import mlflow

        info = {"mlflow_run_id": run_id, "tracking_uri": absolute_uri(mlflow.get_tracking_uri()), **extra}
        (Path(folder) / "lineage.json").write_text(json.dumps(info, indent=2, sort_keys=True))


def data_lineage(data_dir: str | Path) -> dict[str, str]:
    """Tags linking a training run to its corpus: the regeneration run and the manifest's fingerprint."""
    tags = {}
    d = Path(data_dir)
    if (d / "lineage.json").exists():
        tags[SOURCE_RUN_TAG] = json.loads((d / "lineage.json").read_text()).get("mlflow_run_id", "")
    if (d / "manifest.json").exists():
        manifest = json.loads((d / "manifest.json").read_text())
        tags[FINGERPRINT_TAG] = fingerprint_hash(manifest.get("fingerprint", manifest))
    return {k: v for k, v in tags.items() if v}


def run_location(run) -> str:
    """Human-readable pointer to a run: the store URI, the run id and its page in `mlflow ui`."""
    import mlflow

    return (f"run {run.info.run_id} in experiment {run.info.experiment_id} at {mlflow.get_tracking_uri()} "
            f"({ui_link(run.info.experiment_id, run.info.run_id)} under `mlflow ui`)")


# ----------------------------------------------------------------------------- registry


def registered_name(cfg: Config, head_kind: str) -> str:
    """Default registered-model name of an export: `<preset>-<head>` (head 'none' reads 'dflash')."""
    return f"{cfg.preset}-{'dflash' if head_kind == 'none' else head_kind}"


def register_export(run_id: str, name: str, alias: str = "newest", uri: Optional[str] = None):
    """A new version (the ModelVersion) of model `name` from the export logged at `runs:/RUN/export`; `alias` names
    it: `models:/NAME@newest`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code) and "already exists" not in str(e):
            raise
    version = client.create_model_version(name, f"runs:/{run_id}/export", run_id=run_id)
    client.set_registered_model_alias(name, alias, version.version)
    return version


def is_model_uri(spec: Optional[str]) -> bool:
    return bool(spec) and (spec.startswith("models:/") or spec.startswith("runs:/"))


def resolve_checkpoint(spec: Optional[str], dst_root: Optional[str] = None,
                       uri: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
    """(local folder, source run id) for a checkpoint folder or a `models:/NAME@ALIAS` / `runs:/` URI.

    A folder comes back as given, with the training run from its `lineage.json` when present. A model URI
    is downloaded once under $LILICORR_CACHE/models/ (per name and version) from the current store.
    """
    if not spec:
        return spec, None
    if not is_model_uri(spec):
        lineage = Path(spec) / "lineage.json"
        run_id = json.loads(lineage.read_text()).get("mlflow_run_id") if lineage.exists() else None
        return spec, run_id
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from lilicorr.platform.assets import cache_dir

    uri = absolute_uri(uri or tracking_uri())
    client = MlflowClient(tracking_uri=uri)
    run_id, tag = None, spec.split(":/", 1)[1].replace("/", "_").replace("@", "_")
    try:
        if spec.startswith("models:/"):
            body = spec[len("models:/"):]
            if "@" in body:
                name, alias = body.split("@", 1)
                mv = client.get_model_version_by_alias(name, alias)
            else:
                name, version = body.split("/", 1)
                mv = (client.get_latest_versions(name)[-1] if version == "latest"
                      else client.get_model_version(name, version))
            run_id, tag = mv.run_id, f"{mv.name}_v{mv.version}"
        else:
            run_id = spec[len("runs:/"):].split("/", 1)[0]
        dst = Path(dst_root) if dst_root else cache_dir() / "models" / tag
        if not (dst / "config.json").exists():
            dst.mkdir(parents=True, exist_ok=True)
            local = mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=str(dst), tracking_uri=uri)
            dst = Path(local)
    except MlflowException as e:
        raise FileNotFoundError(f"checkpoint {spec!r} not found in the MLflow store "
                                f"{uri}: {e.message}") from None
    return str(dst), run_id
