"""Gradient accumulation (train.micro_batch): the step plan, DeepSpeed's config, and the equivalence of
1 row x 4 accumulated micro-batches with one micro-batch of 4 rows, through a real DeepSpeed engine on a
single-process gloo group (fp32, CPU)."""

from __future__ import annotations

import socket

import pytest
import torch

from lilicorr.config import ConfigError, load_config
from lilicorr.platform.train.schedule import plan_steps


def test_plan_counts_optimizer_steps_with_accumulation():
    cfg = load_config("tiny-random", ["train.global_batch_size=16", "train.micro_batch=2", "train.num_workers=2",
                                      "train.max_steps=None", "train.epochs=2"])
    plan = plan_steps(cfg, num_rows=70, world_size=2)
    # 70 rows -> 35 per worker; a step takes 16 / 2 workers = 8 rows per worker = 2 rows x 4 micro-batches.
    assert (plan.micro_batch, plan.grad_accum) == (2, 4)
    assert (plan.steps_per_epoch, plan.total_steps) == (4, 8)  # 35 // 8 = 4 optimizer steps, 2 epochs
    cfg.train.micro_batch = None  # today's behaviour: the whole per-worker batch at once
    assert (plan_steps(cfg, 70, 2).micro_batch, plan_steps(cfg, 70, 2).grad_accum) == (8, 1)


def test_micro_batch_that_does_not_divide_names_the_fields():
    with pytest.raises(ConfigError, match=r"train\.global_batch_size=16 .* train\.num_workers=2 x train\.micro_batch=3"):
        load_config("tiny-random", ["train.global_batch_size=16", "train.num_workers=2", "train.micro_batch=3"])
    cfg = load_config("tiny-random", ["train.global_batch_size=16", "train.micro_batch=8"])  # 1 worker: 2 x 8
    with pytest.raises(ConfigError, match=r"train\.micro_batch=8; set train\.micro_batch to a divisor of 4"):
        plan_steps(cfg, 100, world_size=4)  # the plan checks the world it runs on too


def test_deepspeed_config_carries_global_micro_and_accumulation():
    from lilicorr.platform.train.engine import deepspeed_config

    cfg = load_config("tiny-random", ["train.global_batch_size=16", "train.micro_batch=2", "train.num_workers=2"])
    ds = deepspeed_config(cfg, plan_steps(cfg, 64, 2))
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (16, 2, 4)


@pytest.fixture(scope="module")
def gloo_world_of_one():
    """torch.distributed with one gloo rank in this process: what DeepSpeed needs to initialise."""
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _one_step(micro: int, rows: list[torch.Tensor]):
    """Build the engine for 4 rows per step as `micro` rows x 4/micro micro-batches; take one optimizer step.
    Returns (grad norm, trainable parameters after the step, the step's mean loss)."""
    from lilicorr.platform.train.engine import build_engine, build_joint
    from lilicorr.platform.train.step import accumulate_step

    cfg = load_config("tiny-random", [
        "head.kind=none", "train.global_batch_size=4", f"train.micro_batch={micro}", "train.precision=fp32",
        "train.zero_stage=0", "drafter.anchors_per_seq=64", "optim.warmup_fraction=0"])
    plan = plan_steps(cfg, num_rows=4, world_size=1)
    assert plan.grad_accum == 4 // micro
    joint = build_joint(cfg, torch.device("cpu"))  # seeded: both runs start from the same weights
    engine, _, _ = build_engine(cfg, joint, plan)
    ids = torch.stack(rows)  # (4, T)
    mask = torch.ones_like(ids, dtype=torch.bool)
    groups = [(ids[i:i + micro], mask[i:i + micro]) for i in range(0, 4, micro)]
    out, norm = accumulate_step(engine, groups, lambda i, b: engine(b[0], b[1], generator=torch.Generator().manual_seed(i),
                                                                    with_metrics=False))
    params = torch.cat([p.detach().flatten().clone() for p in engine.module.parameters()])
    return norm, params, float(out.loss)


def test_four_accumulated_micro_batches_give_the_update_of_one_batch_of_four(gloo_world_of_one):
    # Why these rows give identical updates: the DFlash loss is a weighted mean over a batch's (block, slot)
    # pairs, so a batch of 4 equals the mean of 4 one-row losses (what accumulation computes: each micro
    # loss / 4, gradients summed) only when every row carries the same total weight. Rows of one length with
    # a full loss mask and anchors_per_seq (64) >= T (32) take every eligible position as an anchor whatever
    # the generator: the same blocks, the same valid slots, the same weights in every row. head.kind=none
    # (vanilla DFlash) has no head term normalised over data-dependent counts.
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 49152, (32,), generator=g) for _ in range(4)]
    norm_1x4, params_1x4, loss_1x4 = _one_step(1, rows)
    norm_4x1, params_4x1, loss_4x1 = _one_step(4, rows)
    assert loss_1x4 == pytest.approx(loss_4x1, rel=1e-5)
    # The pre-clipping norm of the accumulated gradient: a sum instead of a mean would be 4x larger.
    assert norm_1x4 is not None and norm_1x4 == pytest.approx(norm_4x1, rel=1e-4)
    before = torch.cat([p.detach().flatten() for p in _fresh_params()])
    assert (params_4x1 - before).abs().max() > 1e-5  # the step did move the weights
    torch.testing.assert_close(params_1x4, params_4x1, rtol=1e-4, atol=1e-6)


def _fresh_params():
    from lilicorr.platform.train.engine import TrainableJoint, build_joint

    cfg = load_config("tiny-random", ["head.kind=none", "drafter.anchors_per_seq=64"])
    return list(TrainableJoint(build_joint(cfg, torch.device("cpu"))).parameters())


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_bf16_accumulated_step_checkpoint_and_validation_on_cpu(gloo_world_of_one, stage, tmp_path):
    """train.precision=bf16 is honoured on CPU: DeepSpeed holds bf16 parameters (fp32 masters in its optimizer
    wrapper) under ZeRO 0, 1 and 2; an accumulated step gives a finite pre-clipping norm read at the boundary
    (ZeRO >= 1 takes it from DeepSpeed: the gradients have left .grad), the checkpoint restores the step and
    weights, and batched validation runs on the bf16 drafter."""
    from lilicorr.platform.train.checkpoint import load_checkpoint, save_checkpoint
    from lilicorr.platform.train.data import pad_rows
    from lilicorr.platform.train.engine import build_engine, build_joint
    from lilicorr.platform.train.shards import synthetic_rows
    from lilicorr.platform.train.step import accumulate_step
    from lilicorr.platform.train.validate import score_rows

    cfg = load_config("tiny-random", ["train.global_batch_size=4", "train.micro_batch=2", "train.precision=bf16",
                                      f"train.zero_stage={stage}", "target.dtype=bfloat16"])
    joint = build_joint(cfg, torch.device("cpu"))
    engine, optimizer, _ = build_engine(cfg, joint, plan_steps(cfg, num_rows=8, world_size=1))
    assert {p.dtype for p in engine.module.parameters()} == {torch.bfloat16}
    rows = synthetic_rows(4, 49152, 20, 30, seed=0)
    ids, mask = pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], 64, False)
    out, norm = accumulate_step(engine, [(ids[:2], mask[:2]), (ids[2:], mask[2:])],
                                lambda i, b: engine(b[0], b[1], generator=torch.Generator().manual_seed(i)))
    assert torch.isfinite(out.loss) and norm is not None and 0 < norm < float("inf")
    saved = {k: v.clone() for k, v in engine.module.state_dict().items()}
    save_checkpoint(tmp_path, cfg, engine, optimizer, joint, 1, 0, 1)
    with torch.no_grad():
        for p in engine.module.parameters():
            p.add_(1.0)
    assert load_checkpoint(tmp_path, cfg, engine, optimizer, 0, 1) == 1
    assert all(torch.equal(v, saved[k]) for k, v in engine.module.state_dict().items())
    held = synthetic_rows(3, 49152, 20, 30, seed=2, prefix="h")
    val = score_rows(engine.module.joint, held, 64, 0, torch.device("cpu"), batch_size=2)
    assert val.rows == 3 and torch.isfinite(torch.tensor(val.means()["loss"]))
