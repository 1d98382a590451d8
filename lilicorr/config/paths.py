"""Path fields: made absolute once, on the driver, when the config is loaded; a missing input refused then.

A job's workers do not run in its working directory (Ray Train starts them in the run's storage folder,
`ray job submit` in an uploaded copy), so a relative path that the driver could open names another folder
there, or none. `load_config` therefore resolves every relative local path against the working directory it
runs in, and refuses an input that is not there, naming the field, the folder it looked at and the fix, in
the job's first second: before the feature cache, the target or Ray start. Remote locations (s3://, hf:,
models:/, a hub id) are left to their loaders; None stays None (tracking.tracking_uri then means
$MLFLOW_TRACKING_URI or the default store, platform/tracking.py). Resolving twice changes nothing, so code
that edits a config after loading it calls `resolve_paths` again (platform/train/driver.py does).

    outputs  train.output_dir, train.feature_cache_dir, eval.output_dir, sweep.output_dir,
             tracking.tracking_uri (sqlite:///<path>, file:<path>, or a path), data.output_dir (regeneration
             writes it, training reads it: refused only when it names a packaged corpus that is not there)
    inputs   train.init_from (an export: a folder with config.json), target.source=local:<dir>,
             data.source=<.jsonl/.json/.parquet file>, drafter.checkpoint when it is a path (not a hub id)
A job's --checkpoint goes through `checkpoint_arg` (lilicorr/cli.py). Pure Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from lilicorr.config.choices import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPORA = REPO_ROOT / "corpora"  # packaged corpora: read-only, never written by a job (platform/corpus.py)
_SOURCE_FILES = (".jsonl", ".json", ".parquet")


def _absolute(value: str, cwd: Path) -> Path:
    return (cwd / Path(value).expanduser()).resolve()


def _missing(key: str, value: str, folder: Path, what: str, cwd: Path) -> ConfigError:
    msg = f"{key}={value}: {folder} {what}"
    if not Path(value).expanduser().is_absolute():
        msg += (f"; relative paths are taken from the working directory {cwd}: run from the repository root or give "
                f"an absolute path")
        if (REPO_ROOT / value).exists() and (REPO_ROOT / value).resolve() != folder:
            msg += f" ({REPO_ROOT / value} exists)"
    return ConfigError(msg)


def _output(value: Optional[str], cwd: Path) -> Optional[str]:
    return value if not value or "://" in value else str(_absolute(value, cwd))


def _tracking_uri(uri: Optional[str], cwd: Path) -> Optional[str]:
    if not uri:
        return uri
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        return uri if path.startswith("/") or path == ":memory:" else "sqlite:///" + str(_absolute(path, cwd))
    if uri.startswith("file:"):
        path = uri[len("file:"):]
        return uri if path.startswith("/") else "file://" + str(_absolute(path, cwd))
    if uri.startswith((".", "~")) or ("/" in uri and ":" not in uri.split("/", 1)[0]):  # a bare path: a file store
        return str(_absolute(uri, cwd))
    return uri  # http(s)://, databricks, ...: not a path


def resolve_paths(cfg: Any) -> None:
    """Every local path field of `cfg` (a schema.Config) made absolute against the working directory, in place;
    ConfigError naming the field when an input is missing (see the module doc)."""
    cwd = Path.cwd().resolve()
    t, d = cfg.train, cfg.data
    if t.init_from:
        folder = _absolute(t.init_from, cwd)
        if not (folder / "config.json").is_file():
            raise _missing("train.init_from", t.init_from, folder,
                           "has no config.json, so it is not an export (a folder written by jobs/train.py or "
                           "jobs/export.py, e.g. checkpoints/<preset>/dflash)", cwd)
        t.init_from = str(folder)
    if cfg.target.source.startswith("local:"):
        value = cfg.target.source.removeprefix("local:")
        folder = _absolute(value, cwd)
        if not folder.is_dir():
            raise _missing("target.source", cfg.target.source, folder,
                           "does not exist (local:<dir> names a folder with config.json, safetensors and the "
                           "tokenizer's files)", cwd)
        cfg.target.source = f"local:{folder}"
    if d.source.endswith(_SOURCE_FILES) and not d.source.startswith(("embedded:", "hf:")) and "://" not in d.source:
        path = _absolute(d.source, cwd)
        if not path.is_file():
            raise _missing("data.source", d.source, path, "does not exist (a .jsonl / .json / .parquet file of "
                           "conversations; or data.source=embedded:sharegpt)", cwd)
        d.source = str(path)
    ckpt = cfg.drafter.checkpoint
    if ckpt and "://" not in ckpt:
        folder = _absolute(ckpt, cwd)
        if folder.exists():
            cfg.drafter.checkpoint = str(folder)
        elif ckpt.startswith(("/", ".", "~")):  # a path, not a hub id (org/name)
            raise _missing("drafter.checkpoint", ckpt, folder, "does not exist (a public DFlash checkpoint: a "
                           "folder, or a hub id such as z-lab/Qwen3-8B-DFlash-b16)", cwd)
    if d.output_dir and "://" not in d.output_dir:
        folder = _absolute(d.output_dir, cwd)
        is_corpus = folder.is_relative_to(CORPORA) or Path(d.output_dir).parts[:1] == ("corpora",)
        if is_corpus and not (folder / "manifest.json").is_file():
            raise _missing("data.output_dir", d.output_dir, folder,
                           f"is not a packaged corpus (no manifest.json); the packaged ones are under {CORPORA} "
                           f"and no job writes there: name one of them, or another folder for regeneration", cwd)
        d.output_dir = str(folder)
    t.output_dir = _output(t.output_dir, cwd)
    t.feature_cache_dir = _output(t.feature_cache_dir, cwd)
    cfg.eval.output_dir = _output(cfg.eval.output_dir, cwd)
    cfg.sweep.output_dir = _output(cfg.sweep.output_dir, cwd)
    cfg.tracking.tracking_uri = _tracking_uri(cfg.tracking.tracking_uri, cwd)


def checkpoint_arg(spec: str, flag: str = "--checkpoint") -> str:
    """A job's --checkpoint made absolute, or ConfigError naming the folder it looked at: DIR (an export or a
    folder of exports), NAME=DIR,... (each DIR), or a models:/ or runs:/ URI (left to platform/tracking.py)."""
    if spec.startswith(("models:/", "runs:/")):
        return spec
    if "=" in spec:
        items = [item.partition("=") for item in spec.split(",")]
        return ",".join(f"{name}{eq}{checkpoint_arg(path, f'{flag} {name}') if path else ''}"
                        for name, eq, path in items)
    cwd = Path.cwd().resolve()
    folder = _absolute(spec, cwd)
    if not folder.is_dir():
        raise _missing(flag, spec, folder, "does not exist (an export written by jobs/train.py or jobs/export.py, "
                       "a folder of them, or models:/NAME@ALIAS)", cwd)
    return str(folder)
