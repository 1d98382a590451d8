"""What MLflow's UI reads from our runs and experiments: the experiment's kind, the Source column, links.

Checked against MLflow 3.17.2's UI bundle (mlflow/server/js/build): the Source column shows the
`mlflow.source.name` tag (its last path component) with `mlflow.source.type`; an experiment's kind is its
`mlflow.experimentKind` tag (ExperimentKind: "custom_model_development" = runs first), but 3.17 lets the
GenAI / Model training switch decide instead (URL parameter `workflowType`, else the browser's last
choice, else GenAI), so the links we print carry `workflowType=machine_learning`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

# Set on every experiment the platform creates: UIs that read the tag open it on its runs.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
SOURCE_NAME_TAG, SOURCE_TYPE_TAG = "mlflow.source.name", "mlflow.source.type"  # the UI's Source column
REPO_ROOT = Path(__file__).resolve().parents[2]


def source_tags(job: str) -> dict[str, str]:
    """The UI's Source column: the job's script relative to the repo (`jobs/train.py`), never a machine path.

    The script actually run when it lies in this checkout; else (pytest, a Ray working_dir copy, a job
    called as a function) `jobs/<job>.py` when that entry point exists, else the job's name."""
    import sys

    argv0 = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.suffix == ".py" and argv0.is_relative_to(REPO_ROOT / "jobs"):
        name = argv0.relative_to(REPO_ROOT).as_posix()
    else:
        script = f"jobs/{job.split('-')[0]}.py"
        name = script if (REPO_ROOT / script).exists() else job
    return {SOURCE_NAME_TAG: name, SOURCE_TYPE_TAG: "LOCAL"}


def ui_link(experiment_id: str, run_id: Optional[str] = None, base: str = "http://127.0.0.1:5000") -> str:
    """The `mlflow ui` page of an experiment's runs (or one run), on the Model training side: without
    `workflowType` a first visit opens on the GenAI trace overview whatever the experiment's tag says."""
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{base}/#/experiments/{experiment_id}/{page}?workflowType=machine_learning"
