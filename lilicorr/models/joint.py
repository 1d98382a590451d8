"""Frozen target + DFlash drafter + speculative head: one forward gives the loss, its terms and metrics.

The training loop (Ray + DeepSpeed, elsewhere) wraps exactly this: `forward`, `param_groups`, `export`.
Exports hold the drafter and head only (never the target), as safetensors + JSON.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from lilicorr.config import Config, OptimConfig
from lilicorr.models.anchors import block_targets, sample_anchors
from lilicorr.models.drafter import DFlashDrafter
from lilicorr.models.drafter_init import build_drafter
from lilicorr.models.export import Export, read_export, write_export
from lilicorr.models.heads import HeadBatch, SpecHead, build_head
from lilicorr.models.heads.lilicorr import LILICORR_CHOICES
from lilicorr.models.losses import oracle_prefix
from lilicorr.models.slot_rows import SlotLM, position_stats
from lilicorr.models.target import TargetAdapter, TargetPass, drafter_capture_ids

@dataclass
class JointOutput:
    loss: Tensor  # scalar
    terms: dict[str, Tensor]  # dflash, ce, dist, margin, head-specific (detached)
    metrics: dict[str, float] = field(default_factory=dict)


class JointModel(nn.Module):
    def __init__(self, cfg: Config, target_hf_model, drafter: Optional[DFlashDrafter] = None):
        super().__init__()
        self.cfg = cfg
        self.target = TargetAdapter(target_hf_model, drafter_capture_ids(target_hf_model.config, cfg.drafter))
        self.drafter = drafter if drafter is not None else build_drafter(cfg.drafter, self.target)
        self.head: SpecHead = build_head(cfg, self.target, self.drafter)
        self.grown_layers = 0  # the last layers init_from_export started as the identity (optim.lr_grown)

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    # ------------------------------------------------------------------ training step

    def forward(self, input_ids: Tensor, loss_mask: Tensor, generator: Optional[torch.Generator] = None,
                anchors: Optional[Tensor] = None, progress: float = 0.0, with_metrics: bool = True,
                features: Optional[TargetPass] = None, anchor_valid: Optional[Tensor] = None) -> JointOutput:
        """input_ids, loss_mask (N, T) -> loss, terms, metrics. `anchors` (N, A) overrides sampling (with
        `anchor_valid` (N, A) marking padding anchors, default all valid); `progress` in [0, 1] is the training
        progress (Domino's lambda decay); `with_metrics=False` skips the metrics that cost an extra head pass
        (simulated acceptance, teacher-forced head top-1); `features`: the target's states for these rows from
        the feature cache (else computed here).

        Memory stays bounded at any vocabulary and anchor count: no (blocks, slots, V) tensor is built; each
        head's LM head, top-K and CE run in checkpointed chunks of `train.ce_chunk_rows` rows (slot_rows.py).
        """
        batch = self._build(input_ids, loss_mask, generator, anchors, progress, features, anchor_valid=anchor_valid)
        out = self.head.loss(batch)
        metrics = dict(out.metrics)
        if with_metrics:
            metrics.update(self._metrics(batch))
        return JointOutput(loss=out.loss, terms={k: v.detach() for k, v in out.terms.items()}, metrics=metrics)

    def build_batch(self, input_ids: Tensor, loss_mask: Tensor, generator: Optional[torch.Generator] = None,
                    anchors: Optional[Tensor] = None, progress: float = 0.0,
                    features: Optional[TargetPass] = None, dense: bool = True) -> HeadBatch:
        """Target states (cached or teacher-forced) + drafter training form -> the C existing blocks.

        dense=True (tests, tools) also gives the (C, S, V) slot_logits (with grad) and target_logits; the
        training step uses dense=False, whose heads compute them chunk by chunk."""
        batch = self._build(input_ids, loss_mask, generator, anchors, progress, features)
        return self.densify(batch) if dense else batch

    def densify(self, batch: HeadBatch) -> HeadBatch:
        """The dense form of a (part of a) batch: slot_logits (grad to hidden) and target_logits over its columns."""
        return dataclasses.replace(batch, slot_logits=batch.lm.drafter_logits(batch.slot_hidden),
                                   target_logits=batch.lm.target_logits(batch.target_hidden))

    def _build(self, input_ids: Tensor, loss_mask: Tensor, generator: Optional[torch.Generator] = None,
               anchors: Optional[Tensor] = None, progress: float = 0.0,
               features: Optional[TargetPass] = None, anchor_valid: Optional[Tensor] = None) -> HeadBatch:
        """The chunked-form batch: hidden states and the target's states per (block, slot) row, no logits."""
        tp = features if features is not None else self.target.teacher_forced(input_ids)
        if anchors is None:
            anchors, anchor_valid = sample_anchors(loss_mask, self.cfg.drafter.anchors_per_seq, generator)
        elif anchor_valid is None:
            anchor_valid = torch.ones_like(anchors, dtype=torch.bool)
        B = self.block_size
        tgt = block_targets(input_ids, loss_mask, anchors, anchor_valid, B)
        # Every input meets the drafter in its parameters' dtype (bf16 under DeepSpeed bf16, fp32 otherwise);
        # the target's own states may be bf16 (its dtype, or the feature cache's) or fp32.
        dtype = self.drafter.fc.weight.dtype
        # (N, A, B, H); the target's embedding is frozen, the drafter's mask vector trains
        block_embeds = self.drafter.embed_blocks(input_ids.gather(1, anchors), self.target.embed).to(dtype)
        captured = tp.captured.to(dtype)
        hidden = self.drafter.forward_train(captured, block_embeds, anchors)  # (N, A, B, H)

        keep = anchor_valid.flatten()  # blocks that exist -> C of them
        slot_hidden = hidden[:, :, 1:].flatten(0, 1)[keep]  # (C, S, H)
        pred_pos = tgt.predictor_pos.flatten(1)  # (N, A*S)

        def at_slots(x: Tensor) -> Tensor:  # per row position (N, T, D) -> per block slot (C, S, D)
            g = x.gather(1, pred_pos[..., None].expand(-1, -1, x.shape[-1]))
            return g.view(*tgt.labels.shape, x.shape[-1]).flatten(0, 1)[keep]

        final = tp.final_hidden  # (N, T, H), the target's dtype or the cache's
        target_hidden = at_slots(final)  # (C, S, H)
        # Compact batch: with a draft vocabulary and a head that takes it, every logit a loss reads covers the draft
        # vocabulary only (V / draft_vocab times less work than full-vocabulary floors).
        lm = SlotLM(self.drafter, self.target.lm_head_weight, self.head.compact_vocab)
        t = self.cfg.train
        # The target's greedy token and log-normaliser once per row position, not per (block, slot): dense anchors
        # overlap A*S/T times (128 x 7 / 384 = 2.3 at 128 anchors, B = 8, T = 384; 512 x 15 / 3,072 = 2.5 at Table 4).
        pos_greedy, pos_lse = position_stats(final, lm, t.ce_chunk_rows)
        greedy = at_slots(pos_greedy[..., None])[..., 0]  # (C, S)
        target_lse = at_slots(pos_lse[..., None])[..., 0]  # (C, S)
        labels, valid = tgt.labels.flatten(0, 1)[keep], tgt.valid.flatten(0, 1)[keep]
        if t.labels == "target":
            labels = torch.where(valid, greedy, labels)  # what greedy verification accepts
        elif t.labels != "corpus":
            raise ValueError(f"train.labels must be 'target' or 'corpus', not {t.labels!r}")
        nH = captured.shape[-1]
        target_state = captured.gather(1, (anchors - 1).clamp_min(0)[..., None].expand(-1, -1, nH))
        anchor_ids = input_ids.gather(1, anchors).flatten()[keep]
        return HeadBatch(slot_logits=None, slot_hidden=slot_hidden, labels=labels, valid=valid,
                         target_logits=None, target_state=target_state.flatten(0, 1)[keep],
                         anchor_ids=anchor_ids, progress=progress,
                         label_drafted=self.drafter.in_draft_vocab(labels), vocab_ids=lm.vocab_ids,
                         target_greedy=greedy, target_hidden=target_hidden, target_lse=target_lse, lm=lm,
                         chunk_rows=t.ce_chunk_rows, beta=self.cfg.drafter.loss_decay_beta, distill=t.distill)

    @torch.no_grad()
    def _metrics(self, batch: HeadBatch) -> dict[str, float]:
        """Per-slot accuracy, oracle prefix coverage, teacher-forced top-1 and simulated acceptance, over dense
        chunks of blocks (at most ~chunk_rows rows of logits at a time)."""
        C, S = batch.labels.shape
        sums = {"acc": 0.0, "n": 0.0, "prefix": 0.0, "head": 0.0, "drafter": 0.0, "oracle": 0.0, "accepted": 0.0}
        step = max(1, batch.chunk_rows // max(1, S))
        has_top1 = False
        for c0 in range(0, C, step):
            # the drafter's logits only: no metric reads the target's (its greedy tokens are in the batch)
            sub = batch.blocks(c0, c0 + step)
            b = dataclasses.replace(sub, slot_logits=sub.lm.drafter_logits(sub.slot_hidden))
            m = b.valid
            argmax = b.column_ids(b.slot_logits.argmax(-1))
            cand = b.column_ids(b.slot_logits.topk(max(1, self.cfg.head.top_k), dim=-1).indices)
            _, prefix = oracle_prefix(cand, b.labels, b.valid)
            sums["acc"] += float(((argmax == b.labels) & m).sum())
            sums["n"] += float(m.sum())
            sums["prefix"] += float(prefix.float().sum())
            top1 = self.head.teacher_forced_top1(b)
            if top1 is not None:
                has_top1 = True
                sums["head"] += float(((top1 == b.labels) & prefix).sum())
                sums["drafter"] += float(((argmax == b.labels) & prefix).sum())
                sums["oracle"] += float(prefix.sum())
            sums["accepted"] += float((self.accepted_drafts(b) + 1).sum())
        metrics = {
            "per_slot_accuracy": sums["acc"] / max(1.0, sums["n"]),
            "oracle_prefix_coverage": sums["prefix"] / (C * S) if C * S else 0.0,
            "blocks": float(C),
        }
        if has_top1 and sums["oracle"] > 0:
            metrics["head_top1_oracle"] = sums["head"] / sums["oracle"]
            metrics["drafter_top1_oracle"] = sums["drafter"] / sums["oracle"]
        metrics["sim_acceptance_length"] = sums["accepted"] / C if C else 0.0
        return metrics

    @torch.no_grad()
    def accepted_drafts(self, b: HeadBatch) -> Tensor:
        """Simulated acceptance: per block of a dense batch (slot_logits filled), how many of the head's proposed
        tokens greedy verification accepts, i.e. the prefix equal to the target's greedy tokens -> (C,) int64.
        The engine accepts the same on the same tokens (tests/engine/test_engine_matches_validation.py)."""
        compact = {} if b.vocab_ids is None else {"vocab_ids": b.vocab_ids}
        prop = self.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids, **compact)
        offered = torch.arange(b.labels.shape[1], device=b.valid.device)[None, :] < prop.num_proposed[:, None]
        ok = (prop.tokens == b.target_greedy) & offered & b.valid
        return torch.cumprod(ok.long(), dim=1).sum(1)

    # ------------------------------------------------------------------ optimiser and export

    def param_groups(self, optim_cfg: OptimConfig) -> list[dict]:
        """Two AdamW groups (Table 4): drafter and head, each with its own LR and weight decay; a third, "grown",
        for the layers init_from added as the identity when optim.lr_grown gives them their own LR."""
        grown_ids = set()
        if optim_cfg.lr_grown is not None and self.grown_layers:
            grown_ids = {id(p) for p in self.drafter.layers[-self.grown_layers:].parameters()}
        drafter = [p for p in self.drafter.parameters() if p.requires_grad]
        groups = [
            {"name": "drafter", "params": [p for p in drafter if id(p) not in grown_ids],
             "lr": optim_cfg.lr_drafter, "weight_decay": optim_cfg.weight_decay_drafter},
            {"name": "head", "params": [p for p in self.head.parameters() if p.requires_grad],
             "lr": optim_cfg.lr_head, "weight_decay": optim_cfg.weight_decay_head},
            {"name": "grown", "params": [p for p in drafter if id(p) in grown_ids],
             "lr": optim_cfg.lr_grown, "weight_decay": optim_cfg.weight_decay_drafter},
        ]
        return [g for g in groups if g["params"]]

    def export(self, directory: str | os.PathLike) -> Path:
        """Write model.safetensors (drafter + head, never the target) and config.json (models/export.py)."""
        return write_export(directory, self.drafter, self.head, self.cfg, self.target.capture_ids)

    @classmethod
    def load_exported(cls, directory: str | os.PathLike, target_hf_model) -> "JointModel":
        """An export of either layout (ours or z-lab's written here) with its target, as its run held it."""
        ex = read_export(directory)
        model = cls(ex.cfg, target_hf_model)
        if model.target.capture_ids != ex.meta.capture_ids:
            raise ValueError(f"export captures {ex.meta.capture_ids}, target gives {model.target.capture_ids}")
        _load_strict(model.drafter, model.head, ex)
        if ex.cfg.train.precision == "bf16":  # as its run held it (DeepSpeed bf16): validation reproduces the run's
            model.drafter.to(torch.bfloat16)
            model.head.to(torch.bfloat16)
        return model

    def init_from_export(self, directory: str | os.PathLike) -> list[str]:
        """Start from another export (train.init_from): its drafter always, its head when the kinds match.

        Returns what was loaded ("drafter", "head"). The drafter's shape and mask mode must match, except that a
        deeper drafter (drafter.num_layers) takes the export's layers first and starts each further one as the
        identity: its residual branches' output projections (o_proj, down_proj) zero, so it drafts as the export did.
        """
        ex = read_export(directory)
        if ex.meta.capture_ids != self.target.capture_ids:
            raise ValueError(f"init_from {directory}: export captures {ex.meta.capture_ids}, "
                             f"this run captures {self.target.capture_ids}")
        drafter_state = dict(ex.drafter_state)
        loaded = ["drafter"]
        added = self._grow_layers(directory, drafter_state)
        if self.drafter.draft_ids is None and "draft_ids" in drafter_state:
            # drafter.draft_vocab=0 continues it over the full vocabulary: the LM head is the target's, so the draft
            # vocabulary is only a list of its rows, dropped here (the export's `full-vocab` conversion, trained on)
            n = drafter_state.pop("draft_ids").numel()
            loaded[0] = f"drafter (its {n}-token draft vocabulary dropped: drafter.draft_vocab=0, the full vocabulary)"
        vocab_in_export = "draft_ids" in drafter_state
        if self.drafter.draft_ids is not None and not vocab_in_export:
            drafter_state["draft_ids"] = self.drafter.draft_ids  # a full-vocab export: keep this run's vocabulary
        self.drafter.load_state_dict(drafter_state)
        self.grown_layers = added
        if added:
            loaded[0] += f" (+{added} layers started as the identity)"
        if vocab_in_export:
            self.drafter.vocab_source = "export"
        if ex.meta.head_kind == self.cfg.head.kind:
            self.head.load_state_dict(ex.head_state)
            # a choice this run makes otherwise than the export (e.g. per-layer attention biases continued as one
            # shared table, by their mean): the head starts from a model not trained as such, so say it
            changed = [f"head.{k}={getattr(self.cfg.head, k)} (trained {getattr(ex.cfg.head, k)})"
                       for k in LILICORR_CHOICES if getattr(self.cfg.head, k) != getattr(ex.cfg.head, k)
                       ] if self.cfg.head.kind == "lilicorr" else []  # the options of a LiLiCorr head only
            loaded.append("head" + (f" continued with {', '.join(changed)}" if changed else ""))
        return loaded

    def _grow_layers(self, directory, drafter_state: dict) -> int:
        """Add this run's layers beyond the export's to `drafter_state` as identity layers; returns how many."""
        have = 1 + max((int(k.split(".")[1]) for k in drafter_state if k.startswith("layers.")), default=-1)
        want = len(self.drafter.layers)
        if have > want:
            raise ValueError(f"init_from {directory}: the export's drafter has {have} layers, this run's "
                             f"drafter.num_layers={want}: set drafter.num_layers={have} or more")
        for i in range(have, want):
            for name, value in self.drafter.layers[i].state_dict().items():
                zero = name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
                drafter_state[f"layers.{i}.{name}"] = torch.zeros_like(value) if zero else value
        return want - have


def _load_strict(drafter: DFlashDrafter, head: SpecHead, ex: Export) -> None:
    # load_state_dict's own strict check, after the modules' load hooks (a lattice reads its bias tables either way)
    for name, module, state in (("drafter", drafter, ex.drafter_state), ("head", head, ex.head_state)):
        found = module.load_state_dict(state, strict=False)
        if found.missing_keys or found.unexpected_keys:
            raise ValueError(f"export keys differ: missing {[f'{name}.{k}' for k in found.missing_keys][:5]}, "
                             f"unexpected {[f'{name}.{k}' for k in found.unexpected_keys][:5]}")


def load_drafter_and_head(directory: str | os.PathLike, target: TargetAdapter,
                          adjust: Optional[Callable[[Config], Config]] = None):
    """For the engine: (drafter, head, cfg) from an export, bound to an existing TargetAdapter, in eval mode.
    adjust: the run's choices applied to the export's config before anything is built (a system's decode
    rule or proposal contract, engine/systems.py); it returns the config to build from."""
    ex = read_export(directory)
    if list(target.capture_ids) != ex.meta.capture_ids:
        raise ValueError(f"export captures {ex.meta.capture_ids}, adapter captures {target.capture_ids}")
    cfg = adjust(ex.cfg) if adjust is not None else ex.cfg
    drafter = DFlashDrafter(cfg.drafter, target)
    head = build_head(cfg, target, drafter)
    drafter.load_state_dict(ex.drafter_state)
    head.load_state_dict(ex.head_state)
    return drafter.eval(), head.eval(), cfg
