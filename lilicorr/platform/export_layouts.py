"""Another engine's layout for a trained export (jobs/export.py, jobs/train.py --export-layout).

The format itself lives in lilicorr/models/export.py; this adds what only the platform has: the export's
target (its HF config for shapes, its stop ids for the mask id, its LM head rows for a draft vocabulary).
"""

from __future__ import annotations

LAYOUTS = ("zlab", "lilicorr")


def export_layout(layout: str, export_dir: str, out_dir: str, drafter_only: bool = False, convert=()) -> list[str]:
    """EXPORT_DIR (our layout) -> OUT_DIR in `layout`; returns the warnings. Raises models.export.ZlabRefused.

    lilicorr (our own layout) with convert=["full-vocab"]: the export without its draft vocabulary.
    zlab: a LiLiCorr export becomes vLLM's / SGLang's LiLiCorrDraftModel (drafter + head), or with `drafter_only`
    a DFlashDraftModel with the head beside it in our layout. `convert`: models.export.CONVERSIONS (lossy) to apply."""
    from lilicorr.models.export import (ZlabRefused, conversions, read_export, write_full_vocab, write_zlab,
                                        zlab_refusal)
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
