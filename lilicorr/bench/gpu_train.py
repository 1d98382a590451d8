"""One joint training step per head at Qwen3-8B shape in plain torch: the GPU script's training rows.

DeepSpeed is not on the GPU image, so this is the step without it: `JointModel(cfg, target)` on a random
target of the real shape (bf16, built on the device), Table 4 settings (512 anchors, block 16, seq 3072,
K 8), torch AdamW over `joint.param_groups(cfg.optim)`, gradient clipping at cfg.optim.grad_clip. Per
head (none = vanilla DFlash, lilicorr, domino, dspark) it records:
  train_<head>_step_s       median of the timed steps (after one warm-up step that allocates AdamW's state)
  train_<head>_peak_gb      torch.cuda.max_memory_allocated over those steps, counting the target's weights
                            once and nothing else this process holds (the decode sections' model is
                            subtracted): what one GPU needs for this step at micro-batch 1
  train_<head>_params_m     trainable parameters (millions); optimizer state measured after the steps
What DeepSpeed bf16 adds on top: its fp32 master weights and fp32 moments (torch AdamW here keeps the
moments in the parameters' bf16), i.e. about 8 bytes per trainable parameter before ZeRO divides them.
`--train-layers N` changes the target's layer count (the dry run: a tiny shape, fp32 on CPU, where bf16
training is not what is being checked).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

HEADS = ("none", "lilicorr", "domino", "dspark")
TABLE4 = ["drafter.anchors_per_seq=512", "drafter.block_size=16", "train.seq_len=3072", "head.top_k=8"]
DRY = ["drafter.anchors_per_seq=16", "drafter.block_size=16", "train.seq_len=128", "head.top_k=8",
       "target.dtype=float32"]
TIMED_STEPS = 2


def train_config(head: str, dry_run: bool, layers: int = 0):
    from lilicorr.config import load_config
    from lilicorr.bench.gpu_decode import QWEN3_8B, TINY

    over = (TINY + DRY) if dry_run else (QWEN3_8B + TABLE4)
    over = over + [f"head.kind={head}"] + ([f"target.num_layers={layers}"] if layers else [])
    return load_config("tiny-random" if dry_run else "qwen3-8b", over)


def train_step(ctx, head: str, layers: int = 0) -> dict:
    """One head's figures; the training target is built once and shared by the heads (ctx.state)."""
    from lilicorr.bench.gpu_decode import build_target, on_device
    from lilicorr.bench.harness import sync
    from lilicorr.models.joint import JointModel

    dev, cfg = ctx.dev, train_config(head, ctx.dry_run, layers)
    if "train_target" not in ctx.state:
        ctx.state["train_target"] = build_target(cfg.target, dev)
    target = ctx.state["train_target"]
    target_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    dtype = next(target.parameters()).dtype
    base = 0
    if dev.type == "cuda":  # what this process held before, less the target counted once
        base = torch.cuda.memory_allocated(dev) - target_bytes
        torch.cuda.reset_peak_memory_stats(dev)
    with on_device(dev, dtype):  # drafter and head created on the device in the target's dtype
        joint = JointModel(cfg, target)
    params = [p for g in joint.param_groups(cfg.optim) for p in g["params"]]
    opt = torch.optim.AdamW(joint.param_groups(cfg.optim), betas=cfg.optim.betas)
    g = torch.Generator(dev).manual_seed(0)
    t = cfg.train.seq_len
    ids = torch.randint(0, target.config.vocab_size, (1, t), generator=g, device=dev)
    mask = torch.ones(1, t, dtype=torch.bool, device=dev)
    losses: list[float] = []

    def step() -> float:
        sync(dev)
        t0 = time.perf_counter()
        loss = joint(ids, mask, generator=g, with_metrics=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))  # one host read per step, after the whole step
        sync(dev)
        return time.perf_counter() - t0

    try:
        first = step()  # allocates AdamW's state; cuBLAS / SDPA set-up
        times = [step() for _ in range(TIMED_STEPS)]
        if not all(math.isfinite(x) for x in losses):
            raise FloatingPointError(f"non-finite loss {losses}")
        state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                          if torch.is_tensor(v))
        res = {f"train_{head}_step_s": statistics.median(times), f"train_{head}_first_step_s": first,
               f"train_{head}_loss": losses[-1], f"train_{head}_params_m": sum(p.numel() for p in params) / 1e6,
               f"train_{head}_optimizer_state_gb": state_bytes / 1e9,
               f"train_{head}_param_dtype": str(params[0].dtype), f"train_{head}_device": str(params[0].device)}
        if dev.type == "cuda":
            res[f"train_{head}_peak_gb"] = (torch.cuda.max_memory_allocated(dev) - base) / 1e9
        else:
            res[f"train_{head}_peak_gb"] = "n/a on CPU (dry run): jobs/bench.py train-memory measures CPU peaks"
    finally:
        del joint, opt, params
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if "train_shape" not in ctx.res:
        c = cfg
        res["train_shape"] = {"target_layers": c.target.num_layers, "hidden": c.target.hidden_size,
                              "vocab": c.target.vocab_size, "target_dtype": str(dtype),
                              "drafter_layers": c.drafter.num_layers, "anchors": c.drafter.anchors_per_seq,
                              "block": c.drafter.block_size, "seq_len": t, "top_k": c.head.top_k,
                              "optimizer": "torch AdamW (no DeepSpeed), moments in the parameters' dtype"}
    return res


def sections(layers: int = 0, heads=HEADS):
    """gpu_decode.Section objects, one per head (each ~1 min budgeted on the GPU)."""
    from lilicorr.bench.sections import Section

    return tuple(Section(f"train_{h}", 45, lambda ctx, h=h: train_step(ctx, h, layers)) for h in heads)
