"""The training loop: Ray Train runs it on every rank (`train_loop_per_worker`), train.runner=local in one process
(train/local.py); both hand `run_loop` a LoopContext (rank, device, data, engine, checkpoints).

Per optimizer step, `grad_accum` micro-batches (train/step.py): the frozen target's teacher-forced pass
(inside JointModel, no grad) gives the captured states and logits; drafter + head train jointly on the
configured loss (Eq. 7, or the margin variant via loss.mu); the LR follows the step's schedule; at the
accumulation boundary DeepSpeed reduces gradients, clips them at optim.grad_clip and steps AdamW. Steps,
the LR schedule, checkpoints, resume, token counts and progress lines all count optimizer steps. Validation and checkpoints run at fixed steps on every rank (they
are collectives); rank 0 alone prints progress and logs to MLflow.
"""

from __future__ import annotations

import os
import shutil
import sys
import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Optional

import torch

from lilicorr.config import Config
from lilicorr.platform.train.checkpoint import load_checkpoint, save_checkpoint
from lilicorr.platform.train.data import iter_rows_ray, iter_train_batches
from lilicorr.platform.train.engine import build_joint
from lilicorr.platform.train.features import FeatureSpec
from lilicorr.platform.train.progress import RankZeroLog
from lilicorr.platform.train.schedule import StepPlan, apply_lr, lr_factor
from lilicorr.platform.train.step import accumulate_step
from lilicorr.platform.train.validate import gather_sums, score_rows


def _device(cfg: Config) -> torch.device:
    if cfg.train.use_gpu:
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


def _maybe_inject_fault(cfg: Config, rank: int, world: int, step: int) -> None:
    """Test hook (train.fail_at_step): the last rank dies once at that step, remembered by a marker file."""
    if cfg.train.fail_at_step is None or step != cfg.train.fail_at_step or rank != world - 1:
        return
    marker = Path(cfg.train.output_dir) / f"fault_injected_at_step_{step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"rank {rank} exited at step {step}\n")
    # Ray Train's controller collects reported checkpoints when it polls the workers (every
    # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s); dying sooner after a report could lose that checkpoint,
    # and the test would then see a restart from an older one instead of the latest.
    time.sleep(2 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")) + 1)
    sys.stdout.write(f"[train] fault hook: rank {rank} exits at step {step}\n")
    sys.stdout.flush()
    os._exit(1)


def _step_seed(seed: int, rank: int, micro_step: int) -> int:
    # Anchor draws differ per rank and micro-batch (step x grad_accum + i: the step itself without
    # accumulation), and a resumed step draws what the lost one would have.
    return (seed * 1_000_003 + rank * 10_007 + micro_step) & 0x7FFFFFFFFFFF


@dataclass
class LoopContext:
    """What the loop needs from where it runs. A shard is anything with Ray Data's
    `iter_batches(batch_size=, batch_format="numpy")` (a Ray shard, or train/local.py's Parquet reader)."""

    rank: int
    world: int
    device: torch.device
    train: object
    heldout: Optional[object]
    build_engine: Callable  # (cfg, joint, plan) -> (engine, optimizer, base LRs)
    resume: Optional[Callable[[], ContextManager[str]]]  # enters the checkpoint to resume from, as a directory
    report: Callable[[dict, Optional[Path], int], None]  # (metrics, staged checkpoint folder or None, step)


def train_loop_per_worker(loop_config: dict) -> None:
    import ray.train
    from ray.train import Checkpoint

    from lilicorr.platform.train.engine import build_engine

    cfg = Config.from_dict(loop_config["config"])
    ctx = ray.train.get_context()
    device = _device(cfg)
    if device.type == "cpu":
        # Ray sets OMP_NUM_THREADS to the worker's 1 reserved CPU, so torch would use one core even when
        # the node has more than it has workers: give each worker its share of the node's cores.
        local = max(1, ctx.get_local_world_size())
        torch.set_num_threads(cfg.train.cpu_threads or max(1, (os.cpu_count() or 1) // local))
    resumed = ray.train.get_checkpoint()

    def report(metrics: dict, staged: Optional[Path], step: int) -> None:
        if staged is None:
            ray.train.report(metrics)
            return
        has_files = any(staged.iterdir())
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(staged)) if has_files else None,
                         checkpoint_dir_name=f"checkpoint_step_{step:07d}")

    run_loop(cfg, loop_config, LoopContext(
        rank=ctx.get_world_rank(), world=ctx.get_world_size(), device=device,
        train=ray.train.get_dataset_shard("train"),
        heldout=ray.train.get_dataset_shard("heldout") if loop_config["has_heldout"] else None,
        build_engine=build_engine, resume=resumed.as_directory if resumed is not None else None, report=report))


def run_loop(cfg: Config, loop_config: dict, ctx: LoopContext) -> None:
    """Train from step 0 (or the checkpoint ctx.resume enters) to plan.total_steps, reporting checkpoints."""
    plan = StepPlan(**loop_config["plan"])
    rank, world, device = ctx.rank, ctx.world, ctx.device
    meta = loop_config.get("features")  # the feature cache's manifest, or None: the target runs live
    features = FeatureSpec.from_manifest(meta) if meta else None
    joint = build_joint(cfg, device, feature_meta=meta, draft_vocab=loop_config.get("draft_vocab"))
    engine, optimizer, base_lrs = ctx.build_engine(cfg, joint, plan)
    group_names = [g.get("name", f"group{i}") for i, g in enumerate(optimizer.param_groups)]  # lr_<name> metrics
    log = RankZeroLog(cfg, plan, loop_config.get("mlflow"), enabled=rank == 0)
    step = 0
    if ctx.resume is not None:
        with ctx.resume() as d:
            step = load_checkpoint(d, cfg, engine, optimizer, rank, world)
        log.resumed(step)
    log.line(f"worker ready: world {world}, micro-batch {plan.micro_batch} x {plan.grad_accum} accumulated, "
             f"{plan.total_steps} steps, "
             f"{'resumed at step ' + str(step) if ctx.resume is not None else 'from scratch'}, device {device}")

    generator = torch.Generator()
    last_val: dict[str, float] = {}
    seen_tokens = 0  # this run's training tokens over all workers (the learning curves' x axis)

    def validation(step: int) -> dict[str, float]:
        # every rank plans over the whole held-out set and scores its own batches of it
        sums = score_rows(engine.module.joint, iter_rows_ray(ctx.heldout), cfg.train.seq_len, cfg.train.seed,
                          device, max_rows=cfg.train.val_max_rows, features=features,
                          batch_size=cfg.train.val_batch_size, rank=rank, world_size=world)
        total = gather_sums(sums)
        val = {f"val_{k}": v for k, v in {**total.means(), "rows": float(total.rows)}.items()}
        val["train_tokens"] = float(seen_tokens)
        log.validation(step, val)
        return val

    if ctx.heldout is not None and step == 0 and cfg.train.init_from:
        # a run that continues an export validates it first: its learning curve starts where the export stands
        last_val = validation(0)
        ctx.report({"step": 0, **last_val}, None, 0)
    engine.train()
    accum = plan.grad_accum
    while step < plan.total_steps:
        epoch, skip = divmod(step, plan.steps_per_epoch)
        taken = 0
        # GPU: batches padded to seq_len (static shapes)
        micro = iter_train_batches(ctx.train, plan.micro_batch, cfg.train.seq_len, cfg.train.use_gpu, skip=skip * accum,
                                   seed=cfg.train.seed, epoch=epoch, features=features,
                                   shuffle_rows=cfg.train.shuffle_rows)
        while True:
            group = list(itertools.islice(micro, accum))  # this optimizer step's micro-batches
            if len(group) < accum:
                break  # the shard ran out (Ray's equal split can yield fewer rows than planned)
            lrs = apply_lr(optimizer.param_groups, base_lrs, lr_factor(step, plan, cfg.optim.schedule, cfg.optim.decay_fraction))
            logged = (step + 1) % cfg.train.log_every == 0 or step + 1 == plan.total_steps

            def forward(i: int, batch: tuple, step: int = step, logged: bool = logged):
                ids, mask, _, tp = batch
                generator.manual_seed(_step_seed(cfg.train.seed, rank, step * accum + i))
                if tp is not None:
                    tp.captured, tp.final_hidden = tp.captured.to(device), tp.final_hidden.to(device)
                # metrics cost a head pass: only on logged steps, on their last micro-batch
                return engine(ids.to(device), mask.to(device), generator=generator, progress=step / plan.total_steps,
                              features=tp, with_metrics=logged and i == accum - 1)

            out, norm = accumulate_step(engine, group, forward)
            real_tokens = sum(b[2] for b in group)  # this rank's real tokens in the step
            step += 1
            taken += 1
            _maybe_inject_fault(cfg, rank, world, step)
            log.train_step(step, out, dict(zip(group_names, lrs)), real_tokens * world, norm)
            seen_tokens += real_tokens * world

            is_last = step == plan.total_steps
            validate = ctx.heldout is not None and (is_last or step % cfg.train.validate_every == 0)
            checkpoint = is_last or step % cfg.train.checkpoint_every == 0
            if validate:
                last_val = validation(step)
            if validate or checkpoint:
                metrics = {"step": step, **last_val, **{f"train_{k}": v for k, v in log.last_train.items()}}
                if checkpoint:
                    staging = Path(tempfile.mkdtemp(prefix=f"lilicorr-ckpt-r{rank}-"))
                    save_checkpoint(staging, cfg, engine, optimizer, joint, step, rank, world)
                    ctx.report(metrics, staging, step)
                    shutil.rmtree(staging, ignore_errors=True)
                    log.line(f"checkpoint at step {step}")
                else:
                    ctx.report(metrics, None, step)
            if is_last or taken >= plan.steps_per_epoch - skip:
                break  # equal steps on every rank, whatever the shard yields
        if taken == 0:
            raise RuntimeError(f"rank {rank}: the training shard yielded no full step of {accum} micro-batches "
                               f"of {plan.micro_batch}")
