"""Checks an evaluation makes before Ray starts: every export it decodes with fits the target.

An export's drafter reads the hidden states of the target it was trained on; on another target the
worker loads the target, then fails (capture ids, shapes) or, worse, decodes with a drafter that never
saw these states. The export's config.json records its target; comparing it with the evaluation's
takes milliseconds, so a mismatch stops here with both names and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from lilicorr.config import Config

# A random target is defined by its shape; any other source names its weights (embedded:, hf:, local:).
_SHAPE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")


class ExportMismatch(ValueError):
    """An export trained on another target than the one this job decodes with."""


def _target_identity(target: dict) -> dict:
    ident = {"source": target.get("source"), "arch": target.get("arch")}
    if target.get("source") == "random":
        ident.update({k: target.get(k) for k in _SHAPE})
    return ident


def require_exports_match_target(cfg: Config, checkpoints: dict[str, Optional[str]]) -> None:
    """Raise ExportMismatch naming the first system whose export was trained on another target."""
    want = _target_identity(cfg.to_dict()["target"])
    for system, folder in checkpoints.items():
        if not folder:
            continue
        meta = json.loads((Path(folder) / "config.json").read_text())
        export_cfg = meta.get("config", {})
        have = _target_identity(export_cfg.get("target", {}))
        if have != want:
            diff = ", ".join(f"{k} {have.get(k)!r} vs {want.get(k)!r}" for k in want if have.get(k) != want.get(k))
            raise ExportMismatch(
                f"evaluate: system {system}'s export {folder} was trained on another target ({diff}: export vs "
                f"--preset {cfg.preset}); run with the export's preset (--preset {export_cfg.get('preset', '?')}) "
                f"or pass an export trained on this target (--checkpoint)")
