"""A full-vocabulary drafter's token ranking, and its draft vocabulary chosen at run time.

A drafter trained over the whole vocabulary scores every one of the target's V LM-head rows per slot. Most of
them are never its answer: restricted to the N tokens its training labels used most, it reads N rows instead of
V (`engine.draft_vocab=N`), a speed lever on a CPU whose LM-head pass is memory-bound. The drafts can change
(a label outside the N is no longer proposable, and the head's candidate probabilities renormalise over the N);
decoding stays lossless, since the target verifies every draft. A drafter trained with its own draft vocabulary
(`drafter.draft_vocab`) proposes from it; the lever then applies nowhere and the run's output says why.

The ranking travels with the export as `vocab_ranking.safetensors`: `token_ids` (int64, most frequent first;
ties by the lower id) and `counts` (their count at the training shards' supervised positions), written by the
training job from the same shards it trained on (or, for an older export, by the training data module's `rank`
command). The ranking, not a fixed list, is stored so that a run can
choose N.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from torch import Tensor

VOCAB_RANKING_FILE = "vocab_ranking.safetensors"
log = logging.getLogger(__name__)


def write_vocab_ranking(directory: str | os.PathLike, token_ids: Tensor, counts: Tensor) -> Path:
    """token_ids (R,) most frequent first, counts (R,) non-increasing -> <directory>/vocab_ranking.safetensors."""
    from safetensors.torch import save_file

    token_ids, counts = token_ids.long().cpu().contiguous(), counts.long().cpu().contiguous()
    if token_ids.shape != counts.shape or token_ids.dim() != 1:
        raise ValueError(f"vocab ranking: token_ids {tuple(token_ids.shape)} and counts {tuple(counts.shape)} must be "
                         "1-D and of one length")
    if counts.numel() > 1 and bool((counts[1:] > counts[:-1]).any()):
        raise ValueError("vocab ranking: counts must be non-increasing (most frequent token first)")
    path = Path(directory) / VOCAB_RANKING_FILE
    save_file({"token_ids": token_ids, "counts": counts}, str(path))
    return path


def read_vocab_ranking(directory: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """(token_ids (R,), counts (R,)) of an export."""
    from safetensors.torch import load_file

    t = load_file(str(Path(directory) / VOCAB_RANKING_FILE))
    return t["token_ids"], t["counts"]


def apply_run_time_vocab(drafter, directory: Optional[str | os.PathLike], size: int) -> str:
    """engine.draft_vocab=size: make a full-vocabulary `drafter` propose from at most `size` tokens, the top of the
    export's ranking in `directory` (None: a random drafter). Returns what it proposes from, for the run's output
    (`describe`), with the reason where the lever does not apply (like an engine lever that cannot run here, the
    drafter then keeps its own vocabulary): a drafter trained with a draft vocabulary larger than `size`, a random
    drafter, an export without a ranking. A ranking shorter than `size` gives all of its tokens."""
    if not size:
        return describe(drafter)
    if not 0 < size < drafter.vocab_size:
        raise ValueError(f"engine.draft_vocab={size} must lie in [1, {drafter.vocab_size}) for a "
                         f"{drafter.vocab_size}-token vocabulary (0 = the drafter's own)")
    skip = None
    if drafter.draft_ids is not None:
        if drafter.draft_ids.numel() > size:
            skip = "its trained draft vocabulary is larger and has no ranking"
    elif directory is None:
        skip = "a random drafter has no token ranking"
    elif not (Path(directory) / VOCAB_RANKING_FILE).is_file():
        skip = (f"the export has no {VOCAB_RANKING_FILE} (the training data module's `rank` command writes it from "
                "the training corpus: docs/design.md §8.1)")
    else:
        ids, _ = read_vocab_ranking(directory)
        drafter.use_draft_vocab(ids[:size])
    out = describe(drafter)
    if skip:
        log.warning("engine.draft_vocab=%d not applied: %s", size, skip)
        out += f" (engine.draft_vocab={size} not applied: {skip})"
    return out


def describe(drafter) -> str:
    """What the drafter proposes from, for a run's output: "full 49152", "8192 trained", "8192 of 49152 run-time"."""
    if drafter.draft_ids is None:
        return f"full {drafter.vocab_size}"
    n = drafter.draft_ids.numel()
    return f"{n} of {drafter.vocab_size} run-time" if drafter.vocab_source == "run-time" else f"{n} trained"
