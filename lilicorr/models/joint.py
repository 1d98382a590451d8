"""Frozen target + DFlash drafter + speculative head: one forward gives the loss, its terms and metrics.

The training loop (Ray + DeepSpeed, elsewhere) wraps exactly this: `forward`, `param_groups`, `export`.
Exports hold the drafter and head only (never the target), as safetensors + JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from lilicorr.config import Config, OptimConfig
from lilicorr.models.anchors import block_targets, sample_anchors
from lilicorr.models.drafter import DFlashDrafter
from lilicorr.models.drafter_init import build_drafter
from lilicorr.models.heads import HeadBatch, SpecHead, build_head
from lilicorr.models.losses import dflash_loss, oracle_prefix
from lilicorr.models.target import TargetAdapter, capture_layer_ids

EXPORT_FORMAT = "lilicorr-drafter-head-v1"


@dataclass
class JointOutput:
    loss: Tensor  # scalar
    terms: dict[str, Tensor]  # dflash, ce, dist, margin, head-specific (detached)
    metrics: dict[str, float] = field(default_factory=dict)


class JointModel(nn.Module):
    def __init__(self, cfg: Config, target_hf_model, drafter: Optional[DFlashDrafter] = None):
        super().__init__()
        self.cfg = cfg
        ids = capture_layer_ids(target_hf_model.config.num_hidden_layers, cfg.drafter.num_layers)
        self.target = TargetAdapter(target_hf_model, ids)
        self.drafter = drafter if drafter is not None else build_drafter(cfg.drafter, self.target)
        self.head: SpecHead = build_head(cfg, self.target, self.drafter)

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    # ------------------------------------------------------------------ training step

    def forward(self, input_ids: Tensor, loss_mask: Tensor, generator: Optional[torch.Generator] = None,
                anchors: Optional[Tensor] = None, progress: float = 0.0, with_metrics: bool = True) -> JointOutput:
        """input_ids, loss_mask (N, T) -> loss, terms, metrics. `anchors` (N, A) overrides sampling;
        `progress` in [0, 1] is the training progress (Domino's lambda decay); `with_metrics=False` skips
        the metrics that cost an extra head pass (simulated acceptance, teacher-forced head top-1)."""
        batch = self.build_batch(input_ids, loss_mask, generator, anchors, progress)
        dflash = dflash_loss(batch.slot_logits, batch.labels, batch.valid, self.cfg.drafter.loss_decay_beta)
        out = self.head.loss(batch, dflash)
        metrics = dict(out.metrics)
        if with_metrics:
            metrics.update(self._metrics(batch))
        return JointOutput(loss=out.loss, terms={k: v.detach() for k, v in out.terms.items()}, metrics=metrics)

    def build_batch(self, input_ids: Tensor, loss_mask: Tensor, generator: Optional[torch.Generator] = None,
                    anchors: Optional[Tensor] = None, progress: float = 0.0) -> HeadBatch:
        """Teacher-forced target pass + drafter training form -> the C existing blocks as a HeadBatch."""
        tp = self.target.teacher_forced(input_ids)
        if anchors is None:
            anchors, anchor_valid = sample_anchors(loss_mask, self.cfg.drafter.anchors_per_seq, generator)
        else:
            anchor_valid = torch.ones_like(anchors, dtype=torch.bool)
        B = self.block_size
        tgt = block_targets(input_ids, loss_mask, anchors, anchor_valid, B)
        with torch.no_grad():
            block_embeds = self.target.embed(self.drafter.block_ids(input_ids, anchors))  # (N, A, B, H)
        hidden = self.drafter.forward_train(tp.captured, block_embeds, anchors)  # (N, A, B, H)

        keep = anchor_valid.flatten()  # blocks that exist -> C of them
        slot_hidden = hidden[:, :, 1:].flatten(0, 1)[keep]  # (C, S, H)
        slot_logits = self.target.lm_head(slot_hidden)  # (C, S, V), frozen weights, grads to hidden
        labels, valid = tgt.labels.flatten(0, 1)[keep], tgt.valid.flatten(0, 1)[keep]
        pred_pos = tgt.predictor_pos.flatten(1)  # (N, A*S)
        V = tp.logits.shape[-1]
        target_logits = tp.logits.gather(1, pred_pos[..., None].expand(-1, -1, V))
        target_logits = target_logits.view(*tgt.labels.shape, V).flatten(0, 1)[keep]  # (C, S, V)
        nH = tp.captured.shape[-1]
        target_state = tp.captured.gather(1, (anchors - 1).clamp_min(0)[..., None].expand(-1, -1, nH))
        anchor_ids = input_ids.gather(1, anchors).flatten()[keep]
        batch = HeadBatch(slot_logits=slot_logits, slot_hidden=slot_hidden, labels=labels, valid=valid,
                          target_logits=target_logits, target_state=target_state.flatten(0, 1)[keep],
                          anchor_ids=anchor_ids, progress=progress)
        return batch

    @torch.no_grad()
    def _metrics(self, batch: HeadBatch) -> dict[str, float]:
        S = batch.labels.shape[1]
        m = batch.valid
        n = m.sum().clamp_min(1).float()
        argmax = batch.slot_logits.argmax(-1)
        cand = batch.slot_logits.topk(max(1, self.cfg.head.top_k), dim=-1).indices
        _, prefix = oracle_prefix(cand, batch.labels, batch.valid)
        metrics = {
            "per_slot_accuracy": float(((argmax == batch.labels) & m).sum() / n),
            "oracle_prefix_coverage": float(prefix.float().mean()) if prefix.numel() else 0.0,
            "blocks": float(batch.labels.shape[0]),
        }
        top1 = self.head.teacher_forced_top1(batch)
        if top1 is not None and prefix.any():
            metrics["head_top1_oracle"] = float(((top1 == batch.labels) & prefix).sum() / prefix.sum())
            metrics["drafter_top1_oracle"] = float(((argmax == batch.labels) & prefix).sum() / prefix.sum())
        # Simulated acceptance length against the target's greedy tokens at the same positions.
        prop = self.head.propose(batch.slot_logits, batch.slot_hidden, batch.target_state, batch.anchor_ids)
        greedy = batch.target_logits.argmax(-1)  # (C, S)
        offered = torch.arange(S, device=m.device)[None, :] < prop.num_proposed[:, None]
        ok = (prop.tokens == greedy) & offered & m
        accepted = torch.cumprod(ok.long(), dim=1).sum(1)
        metrics["sim_acceptance_length"] = float((accepted + 1).float().mean()) if accepted.numel() else 0.0
        return metrics

    # ------------------------------------------------------------------ optimiser and export

    def param_groups(self, optim_cfg: OptimConfig) -> list[dict]:
        """Two AdamW groups (Table 4): drafter and head, each with its own LR and weight decay."""
        groups = [
            {"name": "drafter", "params": [p for p in self.drafter.parameters() if p.requires_grad],
             "lr": optim_cfg.lr_drafter, "weight_decay": optim_cfg.weight_decay_drafter},
            {"name": "head", "params": [p for p in self.head.parameters() if p.requires_grad],
             "lr": optim_cfg.lr_head, "weight_decay": optim_cfg.weight_decay_head},
        ]
        return [g for g in groups if g["params"]]

    def trainable_state_dict(self) -> dict[str, Tensor]:
        sd = {f"drafter.{k}": v for k, v in self.drafter.state_dict().items()}
        sd.update({f"head.{k}": v for k, v in self.head.state_dict().items()})
        return sd

    def export(self, directory: str | os.PathLike) -> Path:
        """Write model.safetensors (drafter + head, never the target) and config.json."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.trainable_state_dict().items()}
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": EXPORT_FORMAT})
        meta = {"format": EXPORT_FORMAT, "config": self.cfg.to_dict(), "capture_ids": self.target.capture_ids,
                "mask_token_id": self.drafter.mask_token_id, "block_size": self.block_size,
                "head_kind": self.cfg.head.kind}
        (d / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        return d

    @classmethod
    def load_exported(cls, directory: str | os.PathLike, target_hf_model) -> "JointModel":
        cfg, state, meta = _read_export(directory)
        cfg.drafter.init, cfg.drafter.checkpoint = "random", None  # weights come from the export
        cfg.drafter.mask_token_id = meta["mask_token_id"]
        model = cls(cfg, target_hf_model)
        if model.target.capture_ids != meta["capture_ids"]:
            raise ValueError(f"export captures {meta['capture_ids']}, target gives {model.target.capture_ids}")
        own = model.trainable_state_dict()
        if set(own) != set(state):
            raise ValueError(f"export keys differ: missing {sorted(set(own) - set(state))[:5]}, "
                             f"unexpected {sorted(set(state) - set(own))[:5]}")
        model.drafter.load_state_dict({k[8:]: v for k, v in state.items() if k.startswith("drafter.")})
        model.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        return model


def _read_export(directory):
    from safetensors.torch import load_file

    d = Path(directory)
    meta = json.loads((d / "config.json").read_text())
    if meta.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{d} is not a {EXPORT_FORMAT} export (format {meta.get('format')!r})")
    return Config.from_dict(meta["config"]), load_file(str(d / "model.safetensors")), meta


def load_drafter_and_head(directory: str | os.PathLike, target: TargetAdapter):
    """For the engine: (drafter, head, cfg) from an export, bound to an existing TargetAdapter, in eval mode."""
    cfg, state, meta = _read_export(directory)
    cfg.drafter.init, cfg.drafter.checkpoint = "random", None
    cfg.drafter.mask_token_id = meta["mask_token_id"]
    if list(target.capture_ids) != meta["capture_ids"]:
        raise ValueError(f"export captures {meta['capture_ids']}, adapter captures {target.capture_ids}")
    drafter = DFlashDrafter(cfg.drafter, target)
    head = build_head(cfg, target, drafter)
    drafter.load_state_dict({k[8:]: v for k, v in state.items() if k.startswith("drafter.")})
    head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
    return drafter.eval(), head.eval(), cfg
