"""The model a training worker steps: JointModel with drafter + head inside a DeepSpeed engine.

The frozen target stays outside the engine. DeepSpeed manages every parameter of the module it wraps:
it broadcasts them at start-up, casts them to bf16, and under ZeRO-3 partitions them. None of that may
touch the target (it is frozen, keeps its own dtype, and must not be sharded away from the teacher-forced
pass), so the engine wraps `TrainableJoint`, whose only registered children are the drafter and the head;
it holds the JointModel (and through it the target) outside the module tree.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
from torch import nn

from lilicorr.config import Config
from lilicorr.config.choices import PRECISIONS
from lilicorr.platform.train.schedule import StepPlan


class TrainableJoint(nn.Module):
    """drafter + head as the module DeepSpeed sees; forward runs the whole JointModel."""

    def __init__(self, joint):
        super().__init__()
        self.drafter = joint.drafter  # same module objects: the engine's params are the joint's
        self.head = joint.head
        object.__setattr__(self, "joint", joint)  # not a child: its target stays out of .parameters()

    def forward(self, *args, **kwargs):
        return self.joint(*args, **kwargs)


def build_joint(cfg: Config, device: torch.device, feature_meta: Optional[dict] = None,
                draft_vocab: Optional[Sequence[int]] = None):
    """The JointModel a run trains, set up in one place and in this order (the order matters):

    1. target loaded by the platform, drafter (+ drafter.checkpoint) and head at the seeded init;
    2. train.init_from: another export's drafter (and head when the kinds match), maybe its draft vocabulary;
    3. feature scale from the captured states' statistics (`feature_meta`: the cache's manifest; else measured live) when
       drafter.feature_scaling: a drafter that starts trained (1 or drafter.checkpoint) keeps what it computes
       (fc divided by the scale); set before 2 instead, loading the export would overwrite fc and the inputs
       would be scaled twice;
    4. the draft vocabulary measured on the training shards (`draft_vocab`), unless 2 brought the export's own.
    """
    from lilicorr.models.joint import JointModel
    from lilicorr.platform.assets import load_target

    torch.manual_seed(cfg.train.seed)  # same drafter/head init on every rank and for every head kind
    hf_model, _ = load_target(cfg.target)
    joint = JointModel(cfg, hf_model)
    if cfg.train.init_from:
        loaded = joint.init_from_export(cfg.train.init_from)
        print(f"[train] init from {cfg.train.init_from}: {', '.join(loaded)}", flush=True)
    if cfg.drafter.feature_scaling:
        rms = (feature_meta or {}).get("channel_rms")
        if rms is None:  # no feature cache: the same statistics from the target just loaded
            from lilicorr.platform.train.features import live_channel_rms

            rms = live_channel_rms(cfg, hf_model)
        started_trained = bool(cfg.train.init_from or cfg.drafter.checkpoint)
        joint.drafter.set_feature_scale(torch.tensor(rms), keep_function=started_trained)
    if draft_vocab is not None and joint.drafter.vocab_source != "export":
        joint.drafter.set_draft_vocab(torch.tensor(list(draft_vocab)))
    return joint.to(device)


def use_bf16(cfg: Config) -> bool:
    """DeepSpeed bf16 (bf16 module parameters, fp32 master weights in the optimizer) on GPU and CPU alike.

    DeepSpeed 0.19's CPU accelerator supports bf16: ZeRO-0 wraps AdamW in its FP16_UnfusedOptimizer (bf16
    mode), ZeRO-1/2 in DeepSpeedZeroOptimizer, both keeping fp32 masters (checked in Ray Train CPU workers on
    gloo). The tiny-random and smollm2-135m presets train in fp32.
    """
    if cfg.train.precision not in PRECISIONS:
        raise ValueError(f"train.precision must be one of {', '.join(PRECISIONS)}, not {cfg.train.precision!r}")
    return cfg.train.precision == "bf16"


def deepspeed_config(cfg: Config, plan: StepPlan) -> dict:
    """The DeepSpeed config: global batch = micro-batch x grad_accum x workers, clipping, ZeRO, bf16."""
    return {
        "train_batch_size": plan.micro_batch * plan.grad_accum * plan.world_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
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
