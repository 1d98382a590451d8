"""The per-epoch shuffle of a worker's training shard (data.iter_train_batches): another order every epoch,
the same order for the same epoch (a resumed run's skip lands on the batches the lost run would have seen)."""

from __future__ import annotations

import numpy as np

from lilicorr.platform.train.data import iter_train_batches


class FakeShard:
    """What iter_train_batches reads of a Ray Data shard: iter_batches over numpy column batches, fixed order."""

    def __init__(self, n: int):
        self.ids = np.empty(n, dtype=object)
        self.masks = np.empty(n, dtype=object)
        for i in range(n):
            self.ids[i] = np.array([i + 1] * 5, dtype=np.int32)  # row i is recognisable by its first token
            self.masks[i] = np.ones(5, dtype=np.int8)

    def iter_batches(self, batch_size: int, batch_format: str = "numpy"):
        for a in range(0, len(self.ids), batch_size):
            yield {"input_ids": self.ids[a:a + batch_size], "loss_mask": self.masks[a:a + batch_size]}


def _order(shard, epoch: int, skip: int = 0, window: int = 1000) -> list[list[int]]:
    return [ids[:, 0].tolist() for ids, _, _, _ in
            iter_train_batches(shard, 4, 16, False, skip=skip, seed=7, epoch=epoch, shuffle_rows=window)]


def test_epochs_differ_and_an_epoch_replays_exactly():
    shard = FakeShard(42)
    e0, e1 = _order(shard, 0), _order(shard, 1)
    assert len(e0) == len(e1) == 10  # 42 rows -> 10 full micro-batches of 4 (the last 2 rows dropped)
    assert e0 == _order(shard, 0)  # same seed and epoch: same order
    assert e0 != e1
    # A real permutation, not a few swaps among neighbours: the epochs' first batches share few rows, and
    # no epoch keeps the stored order.
    assert len(set(e0[0]) & set(e1[0])) <= 2
    assert sum(e0, []) != sorted(sum(e0, []))
    # Rows are each seen at most once per epoch.
    flat = sum(e0, [])
    assert len(flat) == len(set(flat)) == 40
    # A resumed run skipping 3 micro-batches sees exactly the rest of the epoch.
    assert _order(shard, 1, skip=3) == e1[3:]


def test_windows_carry_their_remainder_into_full_micro_batches():
    shard = FakeShard(42)
    got = _order(shard, 0, window=10)  # windows of 10 rows: 10 % 4 = 2 rows carried into the next window
    flat = sum(got, [])
    assert all(len(b) == 4 for b in got) and len(got) == 10 and len(set(flat)) == 40
    assert set(flat[:8]) <= set(range(1, 11))  # the first two micro-batches: rows of the first window only
