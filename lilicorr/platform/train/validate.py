"""Validation on held-out regenerated rows: losses and JointModel's metrics, eval mode, no grad.

Every rank computes the same plan from the whole held-out set, so the figure a training run logs is
reproduced by `validate_export` on the exported checkpoint in one process, whatever the worker count:
  1. rows: every held-out row, or the `train.val_max_rows` with the lowest id hash (a total over all workers);
  2. anchors: each row's own, drawn by `sample_anchors` on the row alone (unpadded) from a generator seeded
     by its id: they do not depend on batch composition, order or sharding;
  3. batches: rows sorted by (anchor count, length, id) and cut into batches of `train.val_batch_size` rows
     of one anchor count (the joint forward takes explicit anchors (N, A), all valid: no padding anchors,
     which would count a block twice); batch j is scored by rank j mod world size.
A batch's figures are its block-weighted means (weight = its blocks), merged over batches and ranks. They
equal the per-row scores' block-weighted means whenever rows' blocks carry equal loss weight (all slots
valid); a partly valid block weighs by its valid slots inside its batch, so the batch size is part of the
plan (a run and validate_export use the config's).
"""

from __future__ import annotations

import heapq
import zlib
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from lilicorr.platform.train.data import pad_rows, row_seed


class MetricSums:
    """Block-weighted sums of per-batch values; `merge` combines workers, `means` gives the averages."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.rows = 0

    def add(self, values: dict[str, float], weight: float, rows: int = 1) -> None:
        self.rows += rows
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def merge(self, other: "MetricSums") -> None:
        self.rows += other.rows
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.weights[k] = self.weights.get(k, 0.0) + other.weights[k]

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in sorted(self.sums) if self.weights[k] > 0}


def select_rows(rows: Iterable[dict], max_rows: Optional[int]) -> list[dict]:
    """Every row, or the `max_rows` with the lowest id hash (order-free; holds at most max_rows rows)."""
    if max_rows is None:
        return list(rows)
    return heapq.nsmallest(max_rows, rows, key=lambda r: (zlib.crc32(str(r["id"]).encode()), str(r["id"])))


@dataclass
class PlannedRow:
    row: dict
    length: int  # tokens scored (the row cut to seq_len)
    anchors: torch.Tensor  # (A_row,) int64 ascending, all valid


def plan_batches(rows: list[dict], seq_len: int, seed: int, num_anchors: int, batch_size: int) -> list[list[PlannedRow]]:
    """Rows -> batches of at most `batch_size` rows of one anchor count (rows with no anchor dropped)."""
    from lilicorr.models.anchors import sample_anchors

    planned = []
    for row in rows:
        n = min(len(row["input_ids"]), seq_len)
        _, mask = pad_rows([row["input_ids"]], [row["loss_mask"]], seq_len, pad_to_seq_len=False)
        gen = torch.Generator().manual_seed(row_seed(row["id"], seed))
        anchors, valid = sample_anchors(mask[:, :n], num_anchors, gen)  # valid ones first
        count = int(valid.sum())
        if count:  # else no position can anchor a block: the row gives no training signal
            planned.append(PlannedRow(row, n, anchors[0, :count]))
    planned.sort(key=lambda p: (p.anchors.numel(), p.length, str(p.row["id"])))
    batches: list[list[PlannedRow]] = []
    for p in planned:
        if batches and len(batches[-1]) < batch_size and batches[-1][0].anchors.numel() == p.anchors.numel():
            batches[-1].append(p)
        else:
            batches.append([p])
    return batches


def _score_batch(joint, batch: list[PlannedRow], seq_len: int, device: torch.device, features) -> tuple[dict, float]:
    T = max(p.length for p in batch)
    ids, mask = pad_rows([p.row["input_ids"] for p in batch], [p.row["loss_mask"] for p in batch], seq_len,
                         pad_to_seq_len=False)
    ids, mask = ids[:, :T], mask[:, :T]  # (N, T): right padding carries no anchor and no label
    anchors = torch.stack([p.anchors for p in batch])  # (N, A)
    tp = None
    if features is not None:
        tp = features.batch({k: [p.row[k] for p in batch] for k in ("captured", "final_hidden")}, T)
        tp.captured, tp.final_hidden = tp.captured.to(device), tp.final_hidden.to(device)
    out = joint(ids.to(device), mask.to(device), anchors=anchors.to(device), features=tp)
    blocks = float(out.metrics.get("blocks", anchors.numel()))
    values = {"loss": float(out.loss), **{f"loss_{k}": float(v) for k, v in out.terms.items()},
              **{k: v for k, v in out.metrics.items() if k != "blocks"}}
    return values, blocks


@torch.no_grad()
def score_rows(joint, rows: Iterable[dict], seq_len: int, seed: int, device: torch.device,
               max_rows: Optional[int] = None, features=None, batch_size: int = 1, rank: int = 0,
               world_size: int = 1) -> MetricSums:
    """Loss, loss terms and metrics of `joint` (put in eval mode here, restored after) on this rank's batches
    of the plan above. `rows`: the whole held-out set (every rank passes the same). `features`
    (features.FeatureSpec): rows carry cached target states, so no target pass runs here."""
    batches = plan_batches(select_rows(rows, max_rows), seq_len, seed, joint.cfg.drafter.anchors_per_seq,
                           max(1, batch_size))
    was_training = joint.training
    joint.eval()
    sums = MetricSums()
    try:
        for batch in batches[rank::world_size]:
            values, blocks = _score_batch(joint, batch, seq_len, device, features)
            sums.add(values, blocks, rows=len(batch))
    finally:
        joint.train(was_training)
    return sums


def gather_sums(sums: MetricSums) -> MetricSums:
    """All workers' sums merged (every rank gets the total)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sums
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, sums)
    total = MetricSums()
    for p in parts:
        total.merge(p)
    return total


def validate_export(export_dir: str, data_dir: str, seed: int, seq_len: Optional[int] = None,
                    max_rows: Optional[int] = None, batch_size: Optional[int] = None) -> dict[str, float]:
    """Load an exported drafter + head (with its target) and score the held-out shards in this process.
    `max_rows` / `batch_size` None: the export's train.val_max_rows / val_batch_size (what its run scored).
    (An export has its feature scale folded into fc and its draft vocabulary inside: no set-up beyond
    JointModel.load_exported, unlike a training run's `engine.build_joint`.)"""
    from lilicorr.models.export import read_meta
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target
    from lilicorr.platform.train.data import iter_rows_local, split_files

    cfg = read_meta(export_dir).run_config()
    hf_model, _ = load_target(cfg.target)
    joint = JointModel.load_exported(export_dir, hf_model)
    files = split_files(data_dir, "heldout")
    if not files:
        raise FileNotFoundError(f"no held-out shards under {data_dir}/heldout")
    sums = score_rows(joint, iter_rows_local(files), seq_len or cfg.train.seq_len, seed, torch.device("cpu"),
                      max_rows=max_rows if max_rows is not None else cfg.train.val_max_rows,
                      batch_size=batch_size or cfg.train.val_batch_size)
    return {**sums.means(), "rows": float(sums.rows)}
