"""Validation on held-out regenerated rows: losses and JointModel's metrics, eval mode, no grad.

Rows are scored one at a time, each with anchors drawn from a generator seeded by its id, so the result
does not depend on batch composition, row order or how rows are sharded over workers: the figure a
training run logs is reproduced by `validate_export` on the exported checkpoint in one process.
Averages are weighted by the number of training blocks each row gives.
"""

from __future__ import annotations

import zlib
from typing import Iterable, Iterator, Optional

import torch

from lilicorr.platform.train.data import pad_rows, row_seed


class MetricSums:
    """Block-weighted sums of per-row values; `merge` combines workers, `means` gives the averages."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.rows = 0

    def add(self, values: dict[str, float], weight: float) -> None:
        self.rows += 1
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


def owns_row(row_id, rank: int, world_size: int) -> bool:
    """Which worker scores a held-out row: by a hash of its id, so the split needs no coordination."""
    return zlib.crc32(str(row_id).encode()) % world_size == rank


def rows_of_rank(rows: Iterable[dict], rank: int, world_size: int) -> Iterator[dict]:
    return (r for r in rows if owns_row(r["id"], rank, world_size))


@torch.no_grad()
def score_rows(joint, rows: Iterable[dict], seq_len: int, seed: int, device: torch.device,
               max_rows: Optional[int] = None, features=None) -> MetricSums:
    """Per-row loss, loss terms and metrics of `joint` (put in eval mode here, restored after).
    `features` (features.FeatureSpec): rows carry cached target states, so no target pass runs here."""
    was_training = joint.training
    joint.eval()
    sums = MetricSums()
    try:
        for i, row in enumerate(rows):
            if max_rows is not None and i >= max_rows:
                break
            n = min(len(row["input_ids"]), seq_len)  # the row alone, unpadded: anchors depend on its length
            ids, mask = pad_rows([row["input_ids"]], [row["loss_mask"]], seq_len, pad_to_seq_len=False)
            ids, mask = ids[:, :n], mask[:, :n]
            if not bool((mask[:, 1:-1] & mask[:, 2:]).any()):
                continue  # no position can anchor a block: the row gives no training signal
            gen = torch.Generator().manual_seed(row_seed(row["id"], seed))
            tp = features.row(row, n) if features is not None else None
            if tp is not None:
                tp.captured, tp.final_hidden = tp.captured.to(device), tp.final_hidden.to(device)
            out = joint(ids.to(device), mask.to(device), generator=gen, features=tp)
            blocks = float(out.metrics.get("blocks", 1.0))
            values = {"loss": float(out.loss), **{f"loss_{k}": float(v) for k, v in out.terms.items()},
                      **{k: v for k, v in out.metrics.items() if k != "blocks"}}
            sums.add(values, blocks)
    finally:
        joint.train(was_training)
    return sums


def gather_sums(sums: MetricSums) -> MetricSums:
    """All workers' sums merged (every rank gets the total)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sums
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {"sums": sums.sums, "weights": sums.weights, "rows": sums.rows})
    total = MetricSums()
    for p in parts:
        other = MetricSums()
        other.sums, other.weights, other.rows = p["sums"], p["weights"], p["rows"]
        total.merge(other)
    return total


def validate_export(export_dir: str, data_dir: str, seed: int, seq_len: Optional[int] = None,
                    max_rows: Optional[int] = None) -> dict[str, float]:
    """Load an exported drafter + head (with its target) and score the held-out shards in this process."""
    import json
    from pathlib import Path

    from lilicorr.config import Config
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target
    from lilicorr.platform.train.data import iter_rows_local, split_files

    cfg = Config.from_dict(json.loads((Path(export_dir) / "config.json").read_text())["config"])
    hf_model, _ = load_target(cfg.target)
    joint = JointModel.load_exported(export_dir, hf_model)
    files = split_files(data_dir, "heldout")
    if not files:
        raise FileNotFoundError(f"no held-out shards under {data_dir}/heldout")
    sums = score_rows(joint, iter_rows_local(files), seq_len or cfg.train.seq_len, seed, torch.device("cpu"),
                      max_rows=max_rows)
    return {**sums.means(), "rows": float(sums.rows)}
