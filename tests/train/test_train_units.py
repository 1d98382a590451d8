"""Fast checks of the training pieces that need no Ray: step plan, LR schedule, batches, state files."""

from __future__ import annotations

import math

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.platform.train.data import count_rows, pad_rows, row_seed, split_files
from lilicorr.platform.train.schedule import apply_lr, lr_factor, plan_steps
from lilicorr.platform.train.shards import split_rows, synthetic_rows, write_shards
from lilicorr.platform.train.state_io import load_tree, save_tree


def test_plan_splits_global_batch_and_caps_steps():
    cfg = load_config("tiny-random", ["train.global_batch_size=8", "train.max_steps=None", "train.epochs=3"])
    plan = plan_steps(cfg, num_rows=50, world_size=2)
    # 50 rows -> 25 per worker -> 6 micro-batches of 4 per epoch; 3 epochs.
    assert (plan.micro_batch, plan.steps_per_epoch, plan.total_steps) == (4, 6, 18)
    assert plan.warmup_steps == math.ceil(0.04 * 18) == 1
    cfg.train.max_steps = 40  # exact step count: data cycled beyond the epochs
    assert plan_steps(cfg, 50, 2).total_steps == 40
    with pytest.raises(ValueError, match="divisible"):
        plan_steps(cfg, 50, 3)
    with pytest.raises(ValueError, match="cannot fill"):
        plan_steps(cfg, 7, 2)


def test_lr_warmup_then_cosine_to_zero_hand_values():
    cfg = load_config("tiny-random", ["train.max_steps=100", "optim.warmup_fraction=0.04", "train.global_batch_size=4"])
    plan = plan_steps(cfg, num_rows=400, world_size=1)
    assert plan.warmup_steps == 4
    assert [lr_factor(s, plan) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, plan) == pytest.approx(1.0)
    assert lr_factor(52, plan) == pytest.approx(0.5)  # halfway through the 96 decay steps
    assert lr_factor(100, plan) == pytest.approx(0.0, abs=1e-12)
    groups = [{"lr": 0.0}, {"lr": 0.0}]
    assert apply_lr(groups, [6e-4, 1.5e-4], 0.5) == [3e-4, 7.5e-5]  # both groups keep Table 4's ratio
    assert [g["lr"] for g in groups] == [3e-4, 7.5e-5]


def test_lr_wsd_holds_then_decays_linearly_to_zero_hand_values():
    cfg = load_config("tiny-random", ["train.max_steps=100", "optim.warmup_fraction=0.04", "train.global_batch_size=4",
                                      "optim.schedule=wsd", "optim.decay_fraction=0.2"])
    plan = plan_steps(cfg, num_rows=400, world_size=1)
    f = [lr_factor(s, plan, cfg.optim.schedule, cfg.optim.decay_fraction) for s in range(101)]
    assert f[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]  # warmup, then held
    assert f[79] == 1.0 and f[80] == 1.0  # the last 20 steps (80..99) decay: 20/20, 19/20, ..., 1/20
    assert f[81] == pytest.approx(0.95) and f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)
    assert f[100] == 0.0
    with pytest.raises(ValueError, match="decay_fraction"):
        lr_factor(50, plan, "wsd", 0.0)


def test_pad_rows_truncates_and_masks_padding():
    ids, mask = pad_rows([[5, 6, 7], [1, 2, 3, 4, 5, 6]], [[0, 1, 1], [1, 1, 1, 1, 1, 1]], seq_len=5,
                         pad_to_seq_len=True)
    assert ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]]
    assert mask.tolist() == [[False, True, True, False, False], [True] * 5]
    ids, _ = pad_rows([[1] * 20], [[1] * 20], seq_len=64, pad_to_seq_len=False)
    assert ids.shape == (1, 32)  # CPU: longest row rounded up to 16


def test_row_seed_depends_on_id_and_seed_only():
    assert row_seed("abc", 0) == row_seed("abc", 0)
    assert row_seed("abc", 0) != row_seed("abd", 0)
    assert row_seed("abc", 0) != row_seed("abc", 1)


def test_shards_round_trip_and_split_is_stable(tmp_path):
    rows = synthetic_rows(10, vocab_size=1000, min_len=8, max_len=12, seed=3)
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) for r in rows)
    assert synthetic_rows(10, 1000, 8, 12, seed=3) == rows  # fixed corpus
    write_shards(rows, tmp_path, "train", rows_per_shard=4)
    files = split_files(str(tmp_path), "train")
    assert len(files) == 3 and count_rows(files) == 10
    held = {r["id"] for r in split_rows(rows, 0.3)["heldout"]}
    assert held == {r["id"] for r in split_rows(list(reversed(rows)), 0.3)["heldout"]}  # order-free
    assert 0 < len(held) < 10


def test_optimizer_state_round_trips_without_pickle(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-3, "name": "drafter"},
                             {"params": model[1].parameters(), "lr": 2e-4, "weight_decay": 0.01, "name": "head"}],
                            betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randn(5, 3)).square().mean().backward()
        opt.step()
    save_tree(opt.state_dict(), tmp_path / "optim")
    assert b"pickle" not in (tmp_path / "optim.json").read_bytes()
    back = load_tree(tmp_path / "optim")
    fresh = torch.optim.AdamW([{"params": model[0].parameters()}, {"params": model[1].parameters()}])
    fresh.load_state_dict(back)
    ref = opt.state_dict()
    assert fresh.param_groups[1]["betas"] == (0.9, 0.95) and fresh.param_groups[1]["name"] == "head"
    for k, st in ref["state"].items():
        for name, value in st.items():
            assert torch.equal(fresh.state_dict()["state"][k][name], value), (k, name)


def test_state_io_refuses_arbitrary_objects(tmp_path):
    with pytest.raises(TypeError, match="without pickle"):
        save_tree({"scaler": object()}, tmp_path / "bad")


def test_deepspeed_sees_drafter_and_head_only():
    """The frozen target stays outside the module DeepSpeed wraps (no broadcast, cast or ZeRO sharding of
    it) while the wrapped forward still runs the whole JointModel; the optimizer groups cover exactly
    the wrapped parameters."""
    from lilicorr.platform.train.engine import TrainableJoint, build_joint, deepspeed_config

    cfg = load_config("tiny-random", ["train.global_batch_size=4"])
    joint = build_joint(cfg, torch.device("cpu"))
    wrapped = TrainableJoint(joint)
    inside = {id(p) for p in wrapped.parameters()}
    target = {id(p) for p in joint.target.parameters()}
    assert inside and not inside & target
    assert inside == {id(p) for g in joint.param_groups(cfg.optim) for p in g["params"]}
    assert not any(k.startswith("target.") or ".hf." in k for k in wrapped.state_dict())
    rows = synthetic_rows(2, cfg.target.vocab_size, 20, 30, seed=0)
    ids, mask = pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], 64, False)
    out = wrapped(ids, mask, generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert all(p.grad is None for p in joint.target.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in wrapped.parameters())

    plan = plan_steps(cfg, num_rows=40, world_size=2)
    ds = deepspeed_config(cfg, plan)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (4, 2, 1)
    assert ds["gradient_clipping"] == cfg.optim.grad_clip == 1.0
    assert deepspeed_config(cfg, plan)["bf16"]["enabled"] is False  # tiny-random trains in fp32
    cfg.train.precision = "bf16"
    assert deepspeed_config(cfg, plan)["bf16"]["enabled"] is True  # honoured on CPU too (DeepSpeed's CPU bf16)
    cfg.train.use_gpu = True
    assert deepspeed_config(cfg, plan)["bf16"]["enabled"] is True


def test_every_head_kind_trains_from_the_same_drafter_init():
    """--head lilicorr|none|domino|dspark: same seed -> identical drafter initialisation (comparable
    systems), and one wrapped forward/backward gives a finite loss and drafter gradients. (A random
    drafter's candidates rarely contain the oracle prefix, so the LiLiCorr head's terms can be 0 here.)"""
    from lilicorr.platform.train.engine import TrainableJoint, build_joint

    rows = synthetic_rows(2, 49152, 20, 30, seed=0)
    drafter_inits = {}
    for kind in ("lilicorr", "none", "domino", "dspark"):
        cfg = load_config("tiny-random", [f"head.kind={kind}"])
        assert cfg.target.vocab_size == 49152  # the rows above use ids below it
        joint = build_joint(cfg, torch.device("cpu"))
        drafter_inits[kind] = {k: v.clone() for k, v in joint.drafter.state_dict().items()}
        ids, mask = pad_rows([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], 64, False)
        out = TrainableJoint(joint)(ids, mask, generator=torch.Generator().manual_seed(0), progress=0.5)
        assert torch.isfinite(out.loss), kind
        out.loss.backward()
        groups = {g["name"]: g["params"] for g in joint.param_groups(cfg.optim)}
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in groups["drafter"]), kind
        assert ("head" in groups) == (kind != "none"), kind  # vanilla DFlash has no head parameters
    ref = drafter_inits["lilicorr"]
    for kind, state in drafter_inits.items():
        assert all(torch.equal(state[k], ref[k]) for k in ref), kind


def test_run_name_changes_with_training_setup_only():
    from lilicorr.platform.train.driver import run_name

    base = run_name(load_config("tiny-random"))
    assert base.startswith("train-lilicorr-")
    # Retries and logging knobs keep the name (Ray Train resumes the run) ...
    assert run_name(load_config("tiny-random", ["train.max_failures=3", "train.log_every=1"])) == base
    # ... anything that shapes training starts a fresh run.
    assert run_name(load_config("tiny-random", ["optim.lr_head=1e-3"])) != base
    assert run_name(load_config("tiny-random", ["train.max_steps=7"])) != base
    assert run_name(load_config("tiny-random", ["head.kind=none"])).startswith("train-none-")


def test_stale_deepspeed_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    import os
    import time

    from lilicorr.platform.train.engine import clear_stale_extension_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "py311_cpu" / "deepspeed_other" / "lock"
    for f in (old, fresh):
        f.parent.mkdir(parents=True)
        f.write_text("")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # left by a build killed an hour ago
    assert clear_stale_extension_locks(max_age_s=600) == [str(old)]
    assert not old.exists() and fresh.exists()
