"""What vLLM's / SGLang's LiLiCorrHead cannot compute as our head was trained (`lilicorr_refusal`), and the named lossy
conversions that lift two of those refusals (`CONVERSIONS`, `conversions`). Part of models/export.py (which
re-exports these names and holds every tensor name mapping); apart only to keep each module under 400 lines.
"""

from __future__ import annotations

from typing import Optional

from lilicorr.config import Config


# Lossy conversions a LiLiCorr export may ask for (write_zlab(convert=...), jobs/export.py --convert): each turns a
# refusal into a model that vLLM's LiLiCorrHead computes exactly but that was NOT trained as such. The text is the
# warning the export returns; measure τ before serving one (jobs/bench.py vllm-lilicorr-head prints it).
CONVERSIONS = {
    "full-vocab": "the drafter was trained with a {n}-token draft vocabulary and the head on candidates drawn from it "
                  "(features normalised over it); this export drops the draft vocabulary: the drafter proposes over "
                  "the target's full vocabulary through its whole LM head, so candidates outside the draft vocabulary "
                  "can appear and every log-prob feature is computed over the full vocabulary, as vLLM's "
                  "LiLiCorrHead requires",
    "shared-slot-bias": "the head was trained with a slot-distance (and same-slot) attention bias per lattice layer "
                        "({n} layers); vLLM's LiLiCorrHead has one table shared by all layers: this export writes "
                        "the mean of the layers' tables, so every layer's attention bias differs from its trained one",
}


def conversions(export, convert=(), drafter_only: bool = False) -> list[str]:
    """The CONVERSIONS asked for, checked against `export` (models.export.Export); only those that change it are kept
    (in CONVERSIONS' order)."""
    unknown = set(convert) - set(CONVERSIONS)
    if unknown:
        raise ValueError(f"unknown conversion(s) {sorted(unknown)}; known: {', '.join(CONVERSIONS)}")
    if convert and (export.meta.head_kind != "lilicorr" or drafter_only):
        raise ValueError(f"conversions {sorted(convert)} apply to a LiLiCorr head exported with it "
                         "(LiLiCorrDraftModel) only")
    needed = {"full-vocab": export.cfg.drafter.draft_vocab > 0,
              "shared-slot-bias": export.cfg.head.num_layers > 1 and export.cfg.head.lilicorr_slot_bias == "per_layer"}
    return [c for c in CONVERSIONS if c in convert and needed[c]]


def lilicorr_refusal(cfg: Config, convert=()) -> Optional[str]:
    """Why vLLM's / SGLang's LiLiCorrHead cannot compute what a head of this config computes (None: it can).
    `convert`: the lossy CONVERSIONS asked for, which lift the refusal each names."""
    h, fix = cfg.head, "fix: retrain with"
    if cfg.drafter.draft_vocab and "full-vocab" not in convert:
        return (f"drafter.draft_vocab={cfg.drafter.draft_vocab}: vLLM's and SGLang's LiLiCorr draw the K candidates "
                f"from the full target vocabulary and refuse a draft vocabulary; {fix} drafter.draft_vocab=0 (or "
                "export --convert full-vocab: a model not trained as such, measure it first)")
    if not 1 <= h.top_k <= 16 or h.top_k & (h.top_k - 1):
        return (f"head.top_k={h.top_k}: vLLM's and SGLang's LiLiCorrHead take a candidate top-K that is a power of "
                f"two <= 16; {fix} head.top_k in 1, 2, 4, 8, 16")
    for key, theirs, what in (
            ("lilicorr_embed", "raw", "the candidates' target embeddings as they are (no RMS normalisation)"),
            ("lilicorr_feature_norm", "layernorm", "a LayerNorm over the five candidate features"),
            ("lilicorr_target", "fused", "the anchor state hidden_norm(fc(.)) of the drafter, then Linear + RMSNorm")):
        if getattr(h, key) != theirs:
            return f"head.{key}={getattr(h, key)}: vLLM's LiLiCorrHead has only {what}; {fix} head.{key}={theirs}"
    if h.num_layers != 1 and h.lilicorr_slot_bias == "per_layer" and "shared-slot-bias" not in convert:
        return (f"head.lilicorr_slot_bias=per_layer with head.num_layers={h.num_layers}: this head learned a "
                "slot-distance attention bias (and a same-slot bias) per lattice layer, vLLM's and SGLang's one table "
                f"shared by all layers; {fix} head.lilicorr_slot_bias=shared (the default) or head.num_layers=1 (or "
                "export --convert shared-slot-bias: a model not trained as such, measure it first)")
    if int(h.width * (h.ffn_width / h.width)) != h.ffn_width:
        return (f"head.ffn_width={h.ffn_width}: vLLM sizes the lattice feed-forward int(width * mlp_ratio), which "
                f"gives no {h.ffn_width} at width {h.width}; {fix} a multiple of head.width")
    return None
