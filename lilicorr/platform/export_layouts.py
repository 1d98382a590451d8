"""Another engine's layout for a trained export (jobs/export.py, jobs/train.py --export-layout).

The format itself lives in lilicorr/models/export.py; this adds what only the platform has: the export's
target (its HF config for shapes, its stop ids for the mask id, its LM head rows for a draft vocabulary), and
our own layout rewritten without its draft vocabulary (`write_full_vocab`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

LAYOUTS = ("zlab", "lilicorr")


def export_layout(layout: str, export_dir: str, out_dir: str, drafter_only: bool = False, convert=()) -> list[str]:
    """EXPORT_DIR (our layout) -> OUT_DIR in `layout`; returns the warnings. Raises models.export.ZlabRefused.

    lilicorr (our own layout) with convert=["full-vocab"]: the export without its draft vocabulary.
    zlab: a LiLiCorr export becomes vLLM's / SGLang's LiLiCorrDraftModel (drafter + head), or with `drafter_only`
    a DFlashDraftModel with the head beside it in our layout. `convert`: models.export.CONVERSIONS (lossy) to apply."""
    from lilicorr.models.export import ZlabRefused, conversions, read_export, write_zlab, zlab_refusal
    from lilicorr.platform.assets import eos_token_ids, load_target

    if layout not in LAYOUTS:
        raise ValueError(f"unknown export layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if layout == "lilicorr":  # our own layout: only the draft vocabulary's conversion rewrites it
        if list(convert) != ["full-vocab"] or drafter_only:
            raise ValueError("--layout lilicorr rewrites our own export with --convert full-vocab only")
        return [write_full_vocab(export_dir, out_dir)]
    ex = read_export(export_dir)
    # before the target loads: the reason needs the config only
    if reason := zlab_refusal(ex.cfg, drafter_only, conversions(ex, convert, drafter_only)):
        raise ZlabRefused(reason)
    hf_model, tok = load_target(ex.cfg.target)
    lm_head = hf_model.get_output_embeddings().weight
    return write_zlab(ex, out_dir, hf_model.config, eos_token_ids(ex.cfg.target, tok), lm_head, drafter_only,
                      convert)


def write_full_vocab(directory: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """Our layout again, the draft vocabulary dropped (CONVERSIONS["full-vocab"]): the drafter's LM head is the
    target's, so the vocabulary is only a list of its rows, and without it the drafter proposes over all of them
    (what a run with drafter.draft_vocab=0 continuing it starts from, and what vLLM's LiLiCorr requires). Returns the
    warning; config.json's `converted` says it too. Weights, head and side files are copied unchanged."""
    from safetensors.torch import load_file, save_file

    from lilicorr.models.export import EXPORT_FORMAT, read_meta
    from lilicorr.models.export_refusals import CONVERSIONS

    src, out = Path(directory), Path(out_dir)
    if read_meta(src).layout != "lilicorr":
        raise ValueError(f"{src} is not in our layout: convert a jobs/train.py export (train.output_dir/export)")
    state = load_file(str(src / "model.safetensors"))
    if "drafter.draft_ids" not in state:
        raise ValueError(f"{src} has no draft vocabulary: it is a full-vocabulary export already")
    warning = CONVERSIONS["full-vocab"].format(n=state.pop("drafter.draft_ids").numel())
    out.mkdir(parents=True, exist_ok=True)
    for side in src.iterdir():  # lineage, token ranking, ...
        if side.is_file() and side.name not in ("model.safetensors", "config.json"):
            shutil.copyfile(side, out / side.name)
    save_file(state, str(out / "model.safetensors"), metadata={"format": EXPORT_FORMAT})
    meta = json.loads((src / "config.json").read_text())
    meta["config"]["drafter"]["draft_vocab"] = 0
    meta["converted"] = {"full-vocab": warning}
    (out / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return warning
