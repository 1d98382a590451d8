"""What the training tests read from a checkpoint beyond what training itself needs."""

from __future__ import annotations

from pathlib import Path

from lilicorr.platform.train.state_io import load_tree


def optimizer_steps_taken(directory: str | Path) -> int:
    """AdamW's own per-parameter step counter in a checkpoint, over every rank's optimizer file: a resumed run
    must not lose or repeat optimizer steps."""
    steps = set()
    for stem in sorted(p.with_suffix("") for p in Path(directory).glob("optim*.json")):
        tree = load_tree(stem)
        state = tree.get("base_optimizer_state", tree)["state"]  # ZeRO nests the torch optimizer's state
        steps |= {int(s["step"]) for s in state.values()}
    if len(steps) != 1:
        raise ValueError(f"optimizer files in {directory} disagree on (or lack) the step count: {sorted(steps)}")
    return steps.pop()
