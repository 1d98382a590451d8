"""Resumable training checkpoints (safetensors + JSON) and the exported drafter + head.

One Ray Train checkpoint directory holds:
  train_state.json                 step reached, world size, ZeRO stage (rank 0)
  trainable.safetensors            drafter + head weights as the engine holds them (rank 0)
  optim.{safetensors,json}         optimizer state, when every rank holds the same (ZeRO 0, fp32)
  optim_rank{r}.{safetensors,json} each rank's optimizer partition otherwise (ZeRO >= 1 or bf16)
  export/                          JointModel.export: what jobs/generate.py loads (rank 0)
Every rank writes its own files into its own local folder; Ray Train merges them on upload.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lilicorr.platform.train.state_io import load_tree, save_tree

FORMAT = "lilicorr-train-state-v1"
EXPORT_SUBDIR = "export"
# Entries of DeepSpeed's ZeRO / bf16 optimizer state that are objects (loss scaler, enum, slice
# mappings for universal checkpoints) derived from the config: not stored, taken from the live optimizer.
LIVE_KEYS = ("loss_scaler", "zero_stage", "param_slice_mappings")


def optimizer_is_replicated(cfg) -> bool:
    """True when each rank's optimizer holds the full, identical state (plain AdamW under ZeRO-0, fp32)."""
    from lilicorr.platform.train.engine import use_bf16

    return cfg.train.zero_stage == 0 and not use_bf16(cfg)


def _optim_stem(directory: Path, cfg, rank: int) -> Path:
    return directory / ("optim" if optimizer_is_replicated(cfg) else f"optim_rank{rank}")


def save_checkpoint(directory: str | Path, cfg, engine, optimizer, joint, step: int, rank: int,
                    world_size: int) -> Path:
    """Write this rank's share of the checkpoint at optimizer step `step` into `directory`."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if rank == 0 or not optimizer_is_replicated(cfg):
        state = optimizer.state_dict()
        save_tree({k: v for k, v in state.items() if k not in LIVE_KEYS}, _optim_stem(d, cfg, rank))
    if rank == 0:
        weights = {k: v.detach().contiguous().cpu().clone() for k, v in engine.module.state_dict().items()}
        save_file(weights, str(d / "trainable.safetensors"))
        state = {"format": FORMAT, "step": step, "world_size": world_size, "zero_stage": cfg.train.zero_stage,
                 "head_kind": cfg.head.kind}
        (d / "train_state.json").write_text(json.dumps(state, indent=2))
        joint.export(d / EXPORT_SUBDIR)
    return d


def read_train_state(directory: str | Path) -> dict:
    state = json.loads((Path(directory) / "train_state.json").read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{directory} is not a {FORMAT} checkpoint")
    return state


def load_checkpoint(directory: str | Path, cfg, engine, optimizer, rank: int, world_size: int) -> int:
    """Restore weights and optimizer state on this rank; returns the optimizer step to resume from."""
    from safetensors.torch import load_file

    d = Path(directory)
    state = read_train_state(d)
    if not optimizer_is_replicated(cfg) and state["world_size"] != world_size:
        raise ValueError(f"checkpoint has {state['world_size']} optimizer partitions, this run {world_size} workers")
    device = next(engine.module.parameters()).device
    weights = load_file(str(d / "trainable.safetensors"), device=str(device))
    engine.module.load_state_dict(weights)
    optim_state = load_tree(_optim_stem(d, cfg, rank), device=device)
    if isinstance(optimizer, torch.optim.AdamW):
        optimizer.load_state_dict(optim_state)
        return int(state["step"])
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    live = optimizer.state_dict()
    optim_state.update({k: live[k] for k in LIVE_KEYS if k in live})
    if isinstance(optimizer, FP16_UnfusedOptimizer):
        # bf16 under ZeRO-0: DeepSpeed's FP16_UnfusedOptimizer (bf16 mode) takes one dict, fp32 masters included
        optimizer.load_state_dict(optim_state, load_optimizer_states=True)
    else:  # DeepSpeed ZeRO optimizers take a list of partitions; fp32 masters from the state
        # Indexed by data-parallel rank; with the same world size (checked above) DeepSpeed reads only this
        # rank's entry (a rigid checkpoint), so the others stay None rather than loading every partition.
        partitions = [None] * world_size
        partitions[rank] = optim_state
        optimizer.load_state_dict(partitions, load_optimizer_states=True, load_from_fp32_weights=True)
    return int(state["step"])

