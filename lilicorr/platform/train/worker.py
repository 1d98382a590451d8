"""The per-worker training loop Ray Train runs on every rank (`train_loop_per_worker`).

Per optimizer step: the frozen target's teacher-forced pass (inside JointModel, no grad) gives the
captured states and logits; drafter + head train jointly on the configured loss (Eq. 7, or the margin
variant via loss.mu); the LR follows the step's schedule; DeepSpeed all-reduces gradients, clips them
at optim.grad_clip and steps AdamW. Validation and checkpoints run at fixed steps on every rank (they
are collectives); rank 0 alone prints progress and logs to MLflow.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from lilicorr.config import Config
from lilicorr.platform.train.checkpoint import load_checkpoint, save_checkpoint
from lilicorr.platform.train.data import iter_rows_ray, iter_train_batches
from lilicorr.platform.train.engine import build_engine, build_joint, grad_norm
from lilicorr.platform.train.features import FeatureSpec
from lilicorr.platform.train.progress import RankZeroLog
from lilicorr.platform.train.schedule import StepPlan, apply_lr, lr_factor
from lilicorr.platform.train.validate import gather_sums, rows_of_rank, score_rows


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


def _step_seed(seed: int, rank: int, step: int) -> int:
    # Anchor draws differ per rank and step, and a resumed step draws what the lost one would have.
    return (seed * 1_000_003 + rank * 10_007 + step) & 0x7FFFFFFFFFFF


def train_loop_per_worker(loop_config: dict) -> None:
    import ray.train
    from ray.train import Checkpoint

    cfg = Config.from_dict(loop_config["config"])
    plan = StepPlan(**loop_config["plan"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = _device(cfg)
    if device.type == "cpu":
        # Ray sets OMP_NUM_THREADS to the worker's 1 reserved CPU, so torch would use one core even when
        # the node has more than it has workers: give each worker its share of the node's cores.
        local = max(1, ctx.get_local_world_size())
        torch.set_num_threads(cfg.train.cpu_threads or max(1, (os.cpu_count() or 1) // local))

    joint = build_joint(cfg, device)
    meta = loop_config.get("features")  # the feature cache's manifest, or None: the target runs live
    features = FeatureSpec.from_manifest(meta) if meta else None
    if cfg.drafter.feature_scaling:
        started_trained = bool(cfg.train.init_from or cfg.drafter.checkpoint)  # keep what that drafter computes
        joint.drafter.set_feature_scale(torch.tensor(meta["channel_rms"]), keep_function=started_trained)
    if loop_config.get("draft_vocab") and joint.drafter.vocab_source != "export":  # else: init_from's own
        joint.drafter.set_draft_vocab(torch.tensor(loop_config["draft_vocab"]))
    engine, optimizer, base_lrs = build_engine(cfg, joint, plan)
    step = 0
    resumed = ray.train.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d:
            step = load_checkpoint(d, cfg, engine, optimizer, rank, world)
    log = RankZeroLog(cfg, plan, loop_config.get("mlflow"), enabled=rank == 0)
    if resumed is not None:
        log.resumed(step)
    log.line(f"worker ready: world {world}, micro-batch {plan.micro_batch}, {plan.total_steps} steps, "
             f"{'resumed at step ' + str(step) if resumed is not None else 'from scratch'}, device {device}")

    train_shard = ray.train.get_dataset_shard("train")
    heldout_shard = ray.train.get_dataset_shard("heldout") if loop_config["has_heldout"] else None
    pad_static = cfg.train.use_gpu
    generator = torch.Generator()
    engine.train()
    last_val: dict[str, float] = {}
    seen_tokens = 0  # this run's training tokens over all workers (the learning curves' x axis)
    while step < plan.total_steps:
        epoch, skip = divmod(step, plan.steps_per_epoch)
        taken = 0
        batches = iter_train_batches(train_shard, plan.micro_batch, cfg.train.seq_len, pad_static, skip=skip,
                                     seed=cfg.train.seed + epoch, features=features)
        for ids, mask, real_tokens, tp in batches:
            generator.manual_seed(_step_seed(cfg.train.seed, rank, step))
            lrs = apply_lr(optimizer.param_groups, base_lrs, lr_factor(step, plan, cfg.optim.schedule, cfg.optim.decay_fraction))
            if tp is not None:
                tp.captured, tp.final_hidden = tp.captured.to(device), tp.final_hidden.to(device)
            logged = (step + 1) % cfg.train.log_every == 0 or step + 1 == plan.total_steps
            out = engine(ids.to(device), mask.to(device), generator=generator, progress=step / plan.total_steps,
                         features=tp, with_metrics=logged)  # metrics cost a head pass: only on logged steps
            engine.backward(out.loss)
            norm = grad_norm(engine)
            engine.step()
            step += 1
            taken += 1
            _maybe_inject_fault(cfg, rank, world, step)
            log.train_step(step, out, lrs, real_tokens * world, norm)
            seen_tokens += real_tokens * world

            is_last = step == plan.total_steps
            validate = heldout_shard is not None and (is_last or step % cfg.train.validate_every == 0)
            checkpoint = is_last or step % cfg.train.checkpoint_every == 0
            if validate:
                mine = rows_of_rank(iter_rows_ray(heldout_shard), rank, world)  # the full set, this rank's rows
                sums = score_rows(engine.module.joint, mine, cfg.train.seq_len,
                                  cfg.train.seed, device, max_rows=cfg.train.val_max_rows, features=features)
                total = gather_sums(sums)
                last_val = {f"val_{k}": v for k, v in {**total.means(), "rows": float(total.rows)}.items()}
                last_val["train_tokens"] = float(seen_tokens)
                log.validation(step, last_val)
            if validate or checkpoint:
                metrics = {"step": step, **last_val, **{f"train_{k}": v for k, v in log.last_train.items()}}
                if checkpoint:
                    staging = Path(tempfile.mkdtemp(prefix=f"lilicorr-ckpt-r{rank}-"))
                    save_checkpoint(staging, cfg, engine, optimizer, joint, step, rank, world)
                    has_files = any(staging.iterdir())
                    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(staging)) if has_files else None,
                                     checkpoint_dir_name=f"checkpoint_step_{step:07d}")
                    shutil.rmtree(staging, ignore_errors=True)
                    log.line(f"checkpoint at step {step}")
                else:
                    ray.train.report(metrics)
            if is_last or taken >= plan.steps_per_epoch - skip:
                break  # equal steps on every rank, whatever the shard yields
        if taken == 0:
            raise RuntimeError(f"rank {rank}: the training shard yielded no full micro-batch of {plan.micro_batch}")
    log.close()
