"""Run inputs for MLflow's Dataset column and lineage: the regenerated corpus and the benchmarks.

A corpus is a folder of Parquet shards with a manifest (regenerate/shards.py); its dataset is
metadata only (nothing is uploaded): name = the folder's name, digest = the manifest fingerprint's hash
(the `lilicorr.data_fingerprint` tag, so one corpus has one digest in every run that used it), source =
the folder (or its URI), profile = rows per split. A benchmark's digest hashes its prompts.
The UI lists a run's datasets with their context: "regenerated" (the run that wrote the corpus),
"training" (a training run), "evaluation" (the prompts an evaluation decoded), "drafter-training" (the
corpus an evaluated export was trained on).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

CONTEXT_TAG = "mlflow.data.context"


def corpus_dataset(data_dir: str | Path):
    """A metadata-only mlflow Dataset for a regenerated corpus (None when the folder has no manifest)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    from lilicorr.platform.tracking import fingerprint_hash

    if "://" in str(data_dir) or not (Path(data_dir) / "manifest.json").exists():  # remote corpora: lineage tags only
        return None
    d = Path(data_dir)
    manifest = json.loads((d / "manifest.json").read_text())
    shards = manifest.get("shards", {}).values()
    profile = {split: sum(int(s.get(split, 0) or 0) for s in shards) for split in ("train", "heldout")}

    class _Corpus(MetaDataset):  # MetaDataset has no profile; the rows per split are what a reader wants
        @property
        def profile(self):
            return {f"{k}_rows": v for k, v in profile.items()}

        def to_dict(self):  # what MLflow stores: MetaDataset's fields leave the profile out
            return {**super().to_dict(), "profile": json.dumps(self.profile)}

    import warnings

    with warnings.catch_warnings():  # a local path matches two registered local sources: the same class
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(d.resolve()))
    return _Corpus(source=source, name=d.resolve().name,
                   digest=fingerprint_hash(manifest.get("fingerprint", manifest)))


def benchmark_dataset(name: str, rows: list[dict]):
    """A metadata-only mlflow Dataset for the prompts of one benchmark as an evaluation used them."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
    # Rows come from a loader (a packaged file or the hub), not one path: the source names the loader.
    source = CodeDatasetSource({"loader": "lilicorr.platform.evaluate.benchmarks.load_benchmark", "benchmark": name,
                                "prompts": str(len(rows))})
    return MetaDataset(source=source, name=name, digest=digest)


def log_datasets(client, run_id: str, datasets: list[tuple[object, str]]) -> int:
    """Log (dataset, context) pairs as inputs of `run_id`; None datasets are skipped. Returns how many."""
    from mlflow.entities import DatasetInput, InputTag

    inputs = [DatasetInput(ds._to_mlflow_entity(), tags=[InputTag(CONTEXT_TAG, ctx)])
              for ds, ctx in datasets if ds is not None]
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    return len(inputs)


def log_corpus(client, run_id: str, data_dir: Optional[str], context: str) -> bool:
    """The corpus at `data_dir` as an input of `run_id` (False when there is no corpus there yet)."""
    if not data_dir:
        return False
    return log_datasets(client, run_id, [(corpus_dataset(data_dir), context)]) == 1
