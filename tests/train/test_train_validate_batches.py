"""Batched validation (validate.score_rows): each row keeps its own anchors, batches group one anchor count,
ranks split the batches, and batched figures equal one-by-one figures on a tiny random model."""

from __future__ import annotations

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.platform.train.shards import synthetic_rows
from lilicorr.platform.train.validate import MetricSums, plan_batches, score_rows, select_rows


def _rows(n: int, length: int, seed: int, prefix: str) -> list[dict]:
    rows = synthetic_rows(n, 49152, length, length, seed=seed, prefix=prefix)
    for r in rows:
        r["loss_mask"] = [1] * len(r["input_ids"])
    return rows


def test_plan_keeps_each_rows_anchors_and_groups_one_anchor_count():
    short = _rows(3, 6, seed=1, prefix="s")  # 6 tokens: 4 eligible positions < 8 anchors
    long = _rows(5, 40, seed=2, prefix="l")  # 38 eligible positions: 8 anchors each
    alone = {p.row["id"]: p.anchors for r in short + long for p in plan_batches([r], 64, 0, 8, 1)[0]}
    batches = plan_batches(long + short, 64, 0, 8, batch_size=2)
    assert [len(b) for b in batches] == [2, 1, 2, 2, 1]  # the 3 short rows (4 anchors) first, then the long
    assert all(len({p.anchors.numel() for p in b}) == 1 for b in batches)
    for b in batches:  # the same anchors as the row planned alone: independent of batch composition
        for p in b:
            assert torch.equal(p.anchors, alone[p.row["id"]])
    assert {p.anchors.numel() for b in batches for p in b} == {4, 8}


def test_val_max_rows_is_a_total_chosen_by_id_hash_not_by_order():
    rows = _rows(20, 12, seed=3, prefix="h")
    picked = {r["id"] for r in select_rows(rows, 5)}
    assert len(picked) == 5 and picked == {r["id"] for r in select_rows(list(reversed(rows)), 5)}
    assert len(select_rows(rows, None)) == 20


@pytest.fixture(scope="module")
def joint():
    from lilicorr.platform.train.engine import build_joint

    # anchors_per_seq 64 >= T: every eligible position anchors a block, so rows of one length have the same
    # blocks and valid slots, and a batch's weighted mean equals the block-weighted mean of its rows'.
    cfg = load_config("tiny-random", ["head.kind=none", "drafter.anchors_per_seq=64"])
    return build_joint(cfg, torch.device("cpu"))


def test_batched_equals_one_by_one_and_ranks_split_the_batches(joint):
    rows = _rows(6, 32, seed=4, prefix="v")
    one = score_rows(joint, rows, 64, seed=0, device=torch.device("cpu"), batch_size=1)
    batched = score_rows(joint, rows, 64, seed=0, device=torch.device("cpu"), batch_size=4)
    assert one.rows == batched.rows == 6
    assert set(one.means()) == set(batched.means()) >= {"loss", "per_slot_accuracy", "sim_acceptance_length"}
    for k, v in one.means().items():
        assert batched.means()[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # Two ranks score the batches j = rank mod 2 of the same plan: merged, the one-process figures exactly.
    parts = [score_rows(joint, rows, 64, seed=0, device=torch.device("cpu"), batch_size=2, rank=r, world_size=2)
             for r in (0, 1)]
    assert parts[0].rows == 4 and parts[1].rows == 2  # 3 batches of 2: rank 0 takes batches 0 and 2
    total = MetricSums()
    for p in parts:
        total.merge(p)
    whole = score_rows(joint, rows, 64, seed=0, device=torch.device("cpu"), batch_size=2)
    assert total.rows == whole.rows and total.means() == pytest.approx(whole.means(), rel=1e-6)
