"""train.runner=local: the training loop in this process on one device, without Ray, DeepSpeed or MLflow.

For a machine that has torch and nothing else (a rented GPU box, the device machine), and for a laptop. The loop
is the Ray Train worker's (worker.run_loop): the same batches in the same shuffled order, anchors, losses, LR
schedule, validation and checkpoints (train/checkpoint.py). What differs is the engine: DeepSpeed's at ZeRO-0 is
AdamW with gradient accumulation and clipping, which LocalEngine does in plain torch (fp32: the same update; tested
against a Ray Train run); bf16 runs the forward under torch.autocast over fp32 weights, where DeepSpeed keeps bf16
weights with fp32 masters (close, not equal). Checkpoints go to <output_dir>/local/checkpoint_step_N (the newest
two kept), and a rerun of the same command resumes from the newest.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from lilicorr.config import Config
from lilicorr.platform.train.data import COLUMNS, split_files
from lilicorr.platform.train.engine import TrainableJoint, use_bf16
from lilicorr.platform.train.schedule import StepPlan
from lilicorr.platform.train.worker import LoopContext, run_loop

KEEP = 2  # checkpoints kept, as the Ray runner's CheckpointConfig(num_to_keep=2)


class ParquetShard:
    """A split's Parquet shards read in this process, with Ray Data's `iter_batches` (numpy format): batches of
    exactly `batch_size` rows across files (the last one shorter), list columns as object arrays, in file order (what
    one Ray Train worker's equal split of the same files yields)."""

    def __init__(self, files: list[str], columns: list[str]):
        self.files, self.columns = files, columns

    def iter_batches(self, batch_size: int, batch_format: str = "numpy") -> Iterator[dict]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if batch_format != "numpy":
            raise ValueError(f"ParquetShard yields numpy batches, not {batch_format!r}")
        table = pa.concat_tables([pq.read_table(f, columns=self.columns) for f in self.files])
        for start in range(0, table.num_rows, batch_size):
            part = table.slice(start, batch_size)
            yield {name: _numpy(part.column(name)) for name in part.column_names}


def _numpy(column) -> np.ndarray:
    """A column as Ray's numpy batches hold it: a list column as a 1-D object array of int64 arrays."""
    import pyarrow as pa

    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        out = np.empty(len(column), dtype=object)
        out[:] = [np.asarray(v, dtype=np.int64) for v in column.to_pylist()]
        return out
    return column.to_numpy(zero_copy_only=False)


class LocalEngine:
    """What the loop and the checkpoints use of DeepSpeed's engine, in plain torch: the loss divided by grad_accum
    per micro-batch, and at the accumulation boundary the gradients clipped at optim.grad_clip (0: not clipped) and
    one AdamW step."""

    def __init__(self, module: TrainableJoint, optimizer: torch.optim.Optimizer, grad_accum: int, grad_clip: float,
                 bf16: bool, device: torch.device):
        self.module, self.optimizer = module, optimizer
        self.grad_accum, self.grad_clip, self.bf16, self.device = grad_accum, grad_clip, bf16, device
        self._micro, self._norm = 0, None

    def __call__(self, *args, **kwargs):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(*args, **kwargs)

    def train(self) -> None:
        self.module.train()

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum).backward()
        self._micro += 1

    def is_gradient_accumulation_boundary(self) -> bool:
        return self._micro % self.grad_accum == 0

    def step(self) -> None:
        if not self.is_gradient_accumulation_boundary():
            return
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self._norm = float(norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_global_grad_norm(self) -> Optional[float]:
        return self._norm


def build_local_engine(cfg: Config, joint, plan: StepPlan):
    """(engine, optimizer, base LRs): Table 4's two AdamW groups, as engine.build_engine makes them for DeepSpeed."""
    module = TrainableJoint(joint)
    optimizer = torch.optim.AdamW(joint.param_groups(cfg.optim), betas=tuple(cfg.optim.betas), eps=1e-8)
    device = next(module.parameters()).device
    engine = LocalEngine(module, optimizer, plan.grad_accum, cfg.optim.grad_clip, use_bf16(cfg), device)
    return engine, optimizer, [g["lr"] for g in optimizer.param_groups]


def run_local(cfg: Config, loop_config: dict) -> tuple[Path, dict]:
    """Train as loop_config says (driver.train builds it); returns the newest checkpoint folder and its metrics."""
    if cfg.train.use_gpu and not torch.cuda.is_available():
        raise RuntimeError("train.use_gpu=true, but torch sees no CUDA device on this machine (a CPU build of torch, or "
                           "no driver): set train.use_gpu=false to train on the CPU")
    root = Path(cfg.train.output_dir).resolve() / "local"
    root.mkdir(parents=True, exist_ok=True)
    found = sorted(root.glob("checkpoint_step_*"))  # this run's checkpoints, oldest first
    device = torch.device("cuda") if cfg.train.use_gpu else torch.device("cpu")
    if cfg.train.cpu_threads and device.type == "cpu":
        torch.set_num_threads(cfg.train.cpu_threads)
    last: dict = {}

    def report(metrics: dict, staged: Optional[Path], step: int) -> None:
        last.clear()
        last.update(metrics)
        if staged is None:
            return
        final = root / f"checkpoint_step_{step:07d}"
        partial = root / f".{final.name}.partial"  # renamed once whole: a killed copy is never resumed from
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(staged, partial)
        (partial / "metrics.json").write_text(json.dumps(metrics, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        for old in sorted(root.glob("checkpoint_step_*"))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)

    data = cfg.data.output_dir
    heldout = split_files(data, "heldout")
    resume = (lambda: contextlib.nullcontext(str(found[-1]))) if found else None
    run_loop(cfg, loop_config, LoopContext(
        rank=0, world=1, device=device, train=ParquetShard(split_files(data, "train"), COLUMNS),
        heldout=ParquetShard(heldout, COLUMNS) if heldout else None, build_engine=build_local_engine,
        resume=resume, report=report))
    newest = sorted(root.glob("checkpoint_step_*"))
    if not newest:
        raise RuntimeError("training finished without a checkpoint")
    metrics = last or json.loads((newest[-1] / "metrics.json").read_text())
    return newest[-1], metrics
