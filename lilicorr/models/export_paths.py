"""Machine paths out of a config dict before it leaves the machine (an export's config.json).

An export travels: it is shipped under checkpoints/, logged to MLflow, downloaded on another node. Its
config records how it was made; an absolute path in it (`data.output_dir=/home/alice/...`) names a
folder of the machine that made it, which nobody elsewhere can open and which leaks that machine's
layout. Nothing reads those fields back from an export (loaders locate the target by `target.source`,
the weights sit beside config.json), so they are kept only as provenance:
  - a path under the repository root (or the working directory) becomes relative to it,
    `outputs/ship3/data`, exactly what a run from the repo root would have written;
  - any other absolute path keeps only its last component, `<elsewhere>/data`;
  - the same inside `sqlite:///<absolute path>` and `file://<absolute path>` URIs.
Remote URIs (s3://, http://, models:/) are locations anyone with access can use: kept as they are.
Pure Python (models/export.py calls it when it writes config.json).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Optional

from lilicorr.config.paths import REPO_ROOT

ELSEWHERE = "<elsewhere>"  # marks a path that was outside the repository, cut to its last component


def _portable_path(path: str, roots: Iterable[Path]) -> str:
    p = Path(os.path.normpath(path))
    for root in roots:
        try:
            rel = p.relative_to(root)
        except ValueError:
            continue
        return rel.as_posix() or "."
    return f"{ELSEWHERE}/{p.name}" if p.name else ELSEWHERE


def portable_value(value: str, roots: Optional[Iterable[Path]] = None) -> str:
    """One string: a machine path made portable (see the module doc); anything else unchanged."""
    roots = list(roots) if roots is not None else [REPO_ROOT, Path.cwd().resolve()]
    for prefix in ("sqlite:///", "file://"):
        if value.startswith(prefix) and value[len(prefix):].startswith("/"):
            return prefix + _portable_path(value[len(prefix):], roots)
    if os.path.isabs(value) or PurePosixPath(value).is_absolute():
        return _portable_path(value, roots)
    return value


def portable_paths(obj: Any, roots: Optional[Iterable[Path]] = None) -> Any:
    """A copy of a JSON-like config (dicts, lists, strings) with every machine path made portable."""
    roots = list(roots) if roots is not None else [REPO_ROOT, Path.cwd().resolve()]
    if isinstance(obj, dict):
        return {k: portable_paths(v, roots) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable_paths(v, roots) for v in obj]
    if isinstance(obj, str):
        return portable_value(obj, roots)
    return obj


def machine_paths(obj: Any, where: str = "") -> list[str]:
    """Every `section.field` whose value is still an absolute local path (tests; the shipping check)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in machine_paths(v, f"{where}.{k}" if where else k)]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in machine_paths(v, f"{where}[{i}]")]
    if isinstance(obj, str) and portable_value(obj, roots=[]) != obj:
        return [f"{where}={obj}"]
    return []
