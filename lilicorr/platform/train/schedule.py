"""How long training runs and at what learning rate: pure arithmetic, no torch, no Ray.

Every worker derives the same plan from the config and the row count, so all ranks take the same number
of optimizer steps (each step is a collective; one step accumulates `grad_accum` micro-batches per worker) and a resumed run picks up exactly where the checkpoint left
off. The learning rate is a function of the step alone (linear warmup over `warmup_fraction` of the steps,
then cosine to zero, constant, or "wsd": constant then linear to zero over the last `decay_fraction`), so
resuming needs no scheduler state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lilicorr.config import Config
from lilicorr.config.rules import accumulation


@dataclass(frozen=True)
class StepPlan:
    world_size: int
    micro_batch: int  # rows per worker per forward/backward
    steps_per_epoch: int  # optimizer steps each worker's equal shard gives
    total_steps: int  # optimizer steps
    warmup_steps: int  # optimizer steps
    grad_accum: int = 1  # micro-batches per worker per optimizer step


def plan_steps(cfg: Config, num_rows: int, world_size: int) -> StepPlan:
    """The step plan for `num_rows` training rows split equally over `world_size` workers."""
    g = cfg.train.global_batch_size
    micro, accum = accumulation(g, world_size, cfg.train.micro_batch)  # ConfigError naming the fields
    # Ray Data's equal split gives each worker num_rows // world_size rows; full optimizer steps only.
    steps_per_epoch = (num_rows // world_size) // (micro * accum)
    if steps_per_epoch == 0:
        raise ValueError(f"{num_rows} training rows cannot fill one global batch of {g} over {world_size} workers")
    # max_steps, when set, is the exact step count (the data is cycled as often as needed), so systems
    # compared at a small budget take the same steps whatever the corpus size; else epochs decide.
    total = cfg.train.max_steps if cfg.train.max_steps is not None else steps_per_epoch * cfg.train.epochs
    warmup = max(1, math.ceil(cfg.optim.warmup_fraction * total)) if cfg.optim.warmup_fraction > 0 else 0
    return StepPlan(world_size=world_size, micro_batch=micro, steps_per_epoch=steps_per_epoch,
                    total_steps=total, warmup_steps=warmup, grad_accum=accum)


def lr_factor(step: int, plan: StepPlan, schedule: str = "cosine", decay_fraction: float = 0.2) -> float:
    """Multiplier of the base LR for optimizer step `step` (0-based): linear warmup, then the schedule.

    "wsd" (warmup-stable-decay) holds the LR, then decays it linearly to 0 over the last `decay_fraction` of
    the steps: a budget cut short by time still has its fast constant phase, and the final decay anneals it.
    """
    if step < plan.warmup_steps:
        return (step + 1) / plan.warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        if not 0.0 < decay_fraction <= 1.0:
            raise ValueError(f"optim.decay_fraction={decay_fraction} must be in (0, 1]")
        decay_steps = max(1, math.ceil(decay_fraction * plan.total_steps))
        return min(1.0, max(0.0, (plan.total_steps - step) / decay_steps))
    if schedule != "cosine":
        raise ValueError(f"unknown optim.schedule {schedule!r} (expected 'cosine', 'constant' or 'wsd')")
    decay_steps = max(1, plan.total_steps - plan.warmup_steps)
    progress = min(1.0, (step - plan.warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_lr(param_groups: list[dict], base_lrs: list[float], factor: float) -> list[float]:
    """Set each group's LR to base × factor (both groups follow one schedule, keeping their ratio)."""
    lrs = []
    for group, base in zip(param_groups, base_lrs):
        group["lr"] = base * factor
        lrs.append(group["lr"])
    return lrs
