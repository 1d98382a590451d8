"""The model a training worker steps: JointModel with drafter + head inside a DeepSpeed engine.

The frozen target stays outside the engine. DeepSpeed manages every parameter of the module it wraps:
it broadcasts them at start-up, casts them to bf16, and under ZeRO-3 partitions them. None of that may
touch the target (it is frozen, keeps its own dtype, and must not be sharded away from the teacher-forced
pass), so the engine wraps `TrainableJoint`, whose only registered children are the drafter and the head;
it holds the JointModel (and through it the target) outside the module tree.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch import nn

from lilicorr.config import Config
from lilicorr.platform.train.schedule import StepPlan


class TrainableJoint(nn.Module):
    """drafter + head as the module DeepSpeed sees; forward runs the whole JointModel."""

    def __init__(self, joint):
        super().__init__()
        self.drafter = joint.drafter  # same module objects: the engine's params are the joint's
        self.head = joint.head
        object.__setattr__(self, "joint", joint)  # not a child: its target stays out of .parameters()

    def forward(self, input_ids, loss_mask, generator=None, progress: float = 0.0, features=None,
                with_metrics: bool = True):
        return self.joint(input_ids, loss_mask, generator=generator, progress=progress, features=features,
                          with_metrics=with_metrics)


def build_joint(cfg: Config, device: torch.device):
    """JointModel on `device`: the target loaded by the platform, drafter (+ public checkpoint) and head."""
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target

    torch.manual_seed(cfg.train.seed)  # same drafter/head init on every rank and for every head kind
    hf_model, _ = load_target(cfg.target)
    joint = JointModel(cfg, hf_model)
    if cfg.train.init_from:
        loaded = joint.init_from_export(cfg.train.init_from)
        print(f"[train] init from {cfg.train.init_from}: {', '.join(loaded)}", flush=True)
    return joint.to(device)


def use_bf16(cfg: Config) -> bool:
    """bf16 (with fp32 master weights) on GPU only; CPU trains in fp32."""
    if cfg.train.precision not in ("bf16", "fp32"):
        raise ValueError(f"train.precision must be 'bf16' or 'fp32', not {cfg.train.precision!r}")
    return cfg.train.precision == "bf16" and cfg.train.use_gpu


def deepspeed_config(cfg: Config, plan: StepPlan) -> dict:
    """The DeepSpeed config: global batch = micro × workers (no accumulation), clipping, ZeRO, bf16."""
    return {
        "train_batch_size": plan.micro_batch * plan.world_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": {"stage": cfg.train.zero_stage},
        "zero_allow_untested_optimizer": True,  # our own torch AdamW with two param groups
        "bf16": {"enabled": use_bf16(cfg)},
        "steps_per_print": 10**9,  # progress lines come from the loop
        "wall_clock_breakdown": False,
    }


def clear_stale_extension_locks(max_age_s: float = 180.0) -> list[str]:
    """Remove torch-extension build locks older than `max_age_s` (what a killed build leaves behind).

    DeepSpeed JIT-builds its CPU shm comm op through torch.utils.cpp_extension, which waits on a lock
    file in the build folder for as long as it exists; a job killed mid-build (or by Ray's memory
    monitor) leaves it, and every later training job then hangs at start-up forever. The build takes
    about a minute, and the lock is only held while it runs, so a lock minutes old is stale.
    """
    import glob
    import time

    from torch.utils.cpp_extension import _get_build_directory  # noqa: F401  (ensures the module layout)

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "torch_extensions")
    removed = []
    for lock in glob.glob(os.path.join(root, "*", "deepspeed_*", "lock")):
        if time.time() - os.path.getmtime(lock) > max_age_s:
            os.remove(lock)
            removed.append(lock)
            print(f"[train] removed a stale DeepSpeed build lock {lock}", flush=True)
    return removed


def build_engine(cfg: Config, joint, plan: StepPlan):
    """(engine, optimizer, base LRs): AdamW over Table 4's two groups, wrapped by DeepSpeed."""
    import deepspeed

    clear_stale_extension_locks()
    module = TrainableJoint(joint)
    groups = joint.param_groups(cfg.optim)
    names = {id(p) for g in groups for p in g["params"]}
    if names != {id(p) for p in module.parameters() if p.requires_grad}:
        raise RuntimeError("param groups do not cover exactly the drafter + head parameters")
    optimizer = torch.optim.AdamW(groups, betas=tuple(cfg.optim.betas), eps=1e-8)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=module, optimizer=optimizer, config=deepspeed_config(cfg, plan), dist_init_required=False)
    return engine, ds_optimizer, base_lrs


def grad_norm(engine) -> Optional[float]:
    """The global gradient norm before clipping. Call between `engine.backward` and `engine.step`.

    Without ZeRO partitioning every rank holds the all-reduced gradients after backward, so the norm is
    computed from them; under ZeRO >= 2 (gradients partitioned) DeepSpeed's own figure is used.
    """
    grads = [p.grad for p in engine.module.parameters() if p.requires_grad]
    if grads and all(g is not None for g in grads):
        return float(torch.linalg.vector_norm(torch.stack([g.detach().float().norm() for g in grads])))
    value = engine.get_global_grad_norm()
    return None if value is None else float(value)
