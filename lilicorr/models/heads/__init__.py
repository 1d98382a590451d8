"""Speculative heads on the DFlash drafter, chosen by name: "none", "lilicorr", "domino", "dspark"."""

from __future__ import annotations

from lilicorr.config import Config
from lilicorr.models.heads.base import HeadBatch, HeadLoss, Proposal, SpecHead
from lilicorr.models.heads.domino import DominoHead
from lilicorr.models.heads.dspark import DSparkHead
from lilicorr.models.heads.lilicorr import LiLiCorrHead
from lilicorr.models.heads.vanilla import VanillaHead

from lilicorr.config.choices import HEAD_KINDS

__all__ = ["build_head", "HEAD_KINDS", "HeadBatch", "HeadLoss", "Proposal", "SpecHead", "LiLiCorrHead",
           "DominoHead", "DSparkHead", "VanillaHead"]


def build_head(cfg: Config, target_adapter, drafter) -> SpecHead:
    """The head named by cfg.head.kind, sized from the target (embedding width, vocab) and the drafter."""
    kind = cfg.head.kind
    tcfg = target_adapter.config
    H_t, V = tcfg.hidden_size, tcfg.vocab_size
    H_d = drafter.hidden_size
    if kind == "none":
        head = VanillaHead()
    elif kind == "lilicorr":
        head = LiLiCorrHead(cfg.head, cfg.loss, H_t, H_d, len(target_adapter.capture_ids), drafter.block_size,
                            drafter.shape.rms_norm_eps)
        head.attach_drafter(drafter)
    elif kind == "domino":
        head = DominoHead(cfg.head, cfg.drafter, H_t, H_d, V)
    elif kind == "dspark":
        head = DSparkHead(cfg.head, H_d, V)
    else:
        raise ValueError(f"unknown head.kind {kind!r}; expected one of {', '.join(HEAD_KINDS)}")
    head.attach_target(target_adapter)
    return head
