"""The drafters shipped with the repository: `checkpoints/<preset>/<export>/` (bf16 safetensors + config).

`--preset smollm2-135m` uses them wherever no checkpoint is given (jobs/generate.py, the demo, evaluation,
the Serve app). Each export serves the systems its head fits: the LiLiCorr export also serves the Viterbi
decode rule, the DFlash export DDTree (a tree over its marginals, no training of its own); a system with
no shipped export (e.g. lilicorr-margin, which needs a μ > 0 run) gets None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "checkpoints"

# system -> the export folder it decodes with (here and in evaluation's checkpoint folders, evaluate/plan.py)
EXPORT_OF_SYSTEM = {"dflash": "dflash", "ddtree": "dflash", "lilicorr": "lilicorr", "lilicorr-viterbi": "lilicorr",
                    "lilicorr-margin": "lilicorr-margin", "domino": "domino", "dspark": "dspark",
                    "dspark-sampled": "dspark"}


def shipped_checkpoint(preset: str, system: str, root: Path = CHECKPOINTS) -> Optional[str]:
    """The shipped export folder for `system` under `preset`, or None when there is none."""
    name = EXPORT_OF_SYSTEM.get(system)
    folder = root / preset / name if name else None
    return str(folder) if folder is not None and (folder / "config.json").exists() else None
