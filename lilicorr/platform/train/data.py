"""Training rows from the regenerated Parquet shards: Ray Data datasets, and padded torch batches.

Shards live under `data.output_dir/{train,heldout}/*.parquet` with columns `id`, `input_ids`
(list<int32>) and `loss_mask` (list<int8>). Rows are truncated to `train.seq_len`; a batch is
right-padded with token 0 and loss_mask 0 (causal attention: padding after a row never changes its
positions, and no anchor or label lands on padding). On GPU batches are padded to `seq_len` exactly
(static shapes); on CPU only to the longest row, rounded up to a multiple of 16 (less wasted compute).
"""

from __future__ import annotations

import glob
import os
import zlib
from typing import Iterator, Optional

import numpy as np
import torch

COLUMNS = ["id", "input_ids", "loss_mask"]
SPLITS = ("train", "heldout")


def split_files(data_dir: str, split: str) -> list[str]:
    """The Parquet shards of one split, sorted (empty when the split does not exist).

    `data_dir` is a local folder or a URI pyarrow understands (s3://, gs://, ...): on a multi-node
    cluster the regenerated corpus lives on shared storage that every worker reads.
    """
    if "://" not in data_dir:
        return sorted(glob.glob(os.path.join(data_dir, split, "*.parquet")))
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(data_dir)
    infos = fs.get_file_info(pafs.FileSelector(f"{root.rstrip('/')}/{split}", allow_not_found=True))
    scheme = data_dir.split("://", 1)[0]
    return sorted(f"{scheme}://{i.path}" for i in infos if i.is_file and i.path.endswith(".parquet"))


def require_train_files(data_dir: str) -> list[str]:
    files = split_files(data_dir, "train")
    if not files:
        raise FileNotFoundError(
            f"no training shards in {os.path.join(data_dir, 'train')}/*.parquet; run jobs/regenerate.py "
            f"with data.output_dir={data_dir} first (or point data.output_dir at regenerated data)")
    return files


def count_rows(files: list[str]) -> int:
    """Rows in the shards, from the Parquet footers (no data read; local paths and URIs alike)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in files)


def ray_datasets(data_dir: str, in_memory: bool, columns: Optional[list[str]] = None) -> dict:
    """{"train": Dataset, "heldout": Dataset (if present)} for TorchTrainer(datasets=...).

    `in_memory` (CPU runs, small corpora) reads the shards here and hands Ray Data the tables, one block
    per shard. Streaming read tasks would need free CPUs, and 2 CPU workers on a 2-CPU node hold them
    all, so those tasks would never be scheduled. GPU runs stream the shards (read tasks use the CPUs
    the GPU workers leave).
    """
    import pyarrow.parquet as pq
    import ray.data

    columns = columns or COLUMNS
    out = {}
    for split in SPLITS:
        files = split_files(data_dir, split)
        if not files:
            continue
        if in_memory:
            out[split] = ray.data.from_arrow([pq.read_table(f, columns=columns) for f in files])
        else:
            out[split] = ray.data.read_parquet(files).select_columns(columns)
    return out


def pad_rows(input_ids: list, loss_mask: list, seq_len: int, pad_to_seq_len: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of 1-D int arrays -> input_ids (N, T) int64, loss_mask (N, T) bool; T <= seq_len."""
    rows = [np.asarray(r, dtype=np.int64)[:seq_len] for r in input_ids]
    masks = [np.asarray(m, dtype=np.int64)[:seq_len] for m in loss_mask]
    longest = max(len(r) for r in rows)
    T = seq_len if pad_to_seq_len else min(seq_len, -(-longest // 16) * 16)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, :len(r)] = torch.from_numpy(r)
        mask[i, :len(m)] = torch.from_numpy(m != 0)
    return ids, mask


def shuffled_rows(shard, window: int, seed: int, epoch: int) -> Iterator[dict]:
    """The shard's rows as numpy column batches, each window of `window` rows in a fresh random order.

    The permutation of window w is drawn from a generator seeded by (seed, epoch, w): every epoch sees
    another order (Ray's local shuffle buffer of a few micro-batches only swapped neighbours, so epochs saw
    nearly the same order), and the same epoch replays the same order, which a resumed run's skip relies on.
    Rows never move across windows or workers (the equal split is fixed), so the window is the lever: a
    worker's whole shard when it fits in host memory (train.shuffle_rows).
    """
    for w, batch in enumerate(shard.iter_batches(batch_size=window, batch_format="numpy")):
        n = len(next(iter(batch.values())))
        order = np.random.default_rng((seed, epoch, w)).permutation(n)
        yield {k: v[order] for k, v in batch.items()}


def _micro_batches(windows: Iterator[dict], micro_batch: int) -> Iterator[dict]:
    """Column batches of any size -> exactly `micro_batch` rows each (a window's remainder carries over;
    the last partial micro-batch of the epoch is dropped)."""
    pending: Optional[dict] = None
    for batch in windows:
        if pending is not None:
            batch = {k: np.concatenate([pending[k], batch[k]]) for k in batch}
        n = len(next(iter(batch.values())))
        full = n - n % micro_batch
        for i in range(0, full, micro_batch):
            yield {k: v[i:i + micro_batch] for k, v in batch.items()}
        pending = {k: v[full:] for k, v in batch.items()} if full < n else None


def iter_train_batches(shard, micro_batch: int, seq_len: int, pad_to_seq_len: bool, skip: int = 0,
                       seed: int = 0, epoch: int = 0, features=None, shuffle_rows: int = 16384) -> Iterator[tuple]:
    """One epoch over a Ray Data shard: (input_ids, loss_mask, real tokens, target features or None) per
    full micro-batch, in the epoch's shuffled order (`shuffled_rows`). `features` (features.FeatureSpec)
    decodes the cached target states of each row.

    `skip` drops the first micro-batches (a resumed run re-enters the epoch where its checkpoint was taken:
    optimizer steps x grad_accum).
    """
    batches = _micro_batches(shuffled_rows(shard, max(shuffle_rows, micro_batch), seed, epoch), micro_batch)
    for i, batch in enumerate(batches):
        if i < skip:
            continue
        ids, mask = pad_rows(list(batch["input_ids"]), list(batch["loss_mask"]), seq_len, pad_to_seq_len)
        real = int(sum(min(len(r), seq_len) for r in batch["input_ids"]))
        tp = features.batch(batch, ids.shape[1]) if features is not None else None
        yield ids, mask, real, tp


def token_ranking(files: list[str]) -> tuple[list[int], list[int]]:
    """(token ids, counts) of every token seen at the supervised (loss-mask) positions of the training shards,
    most frequent first; ties break by the lower id, so every process reading the same shards gets the same list."""
    import pyarrow.parquet as pq

    counts = np.zeros(0, dtype=np.int64)
    for f in files:
        table = pq.read_table(f, columns=["input_ids", "loss_mask"])
        ids = np.concatenate([np.asarray(r, dtype=np.int64) for r in table.column("input_ids").to_pylist()] or [[]])
        keep = np.concatenate([np.asarray(r, dtype=bool) for r in table.column("loss_mask").to_pylist()] or [[]])
        c = np.bincount(ids[keep], minlength=counts.size)
        counts = np.pad(counts, (0, max(0, c.size - counts.size))) + np.pad(c, (0, max(0, counts.size - c.size)))
    order = np.lexsort((np.arange(counts.size), -counts))[:int(np.count_nonzero(counts))]  # count desc, id asc
    return [int(i) for i in order], [int(counts[i]) for i in order]


def draft_vocab_from_shards(files: list[str], size: int) -> list[int]:
    """The `size` most frequent tokens at the supervised positions of the training shards (`token_ranking`),
    ascending: the reduced draft vocabulary (drafter.draft_vocab). A corpus with fewer distinct tokens is topped
    up with the lowest ids it lacks."""
    ranked, _ = token_ranking(files)
    order = ranked[:size]
    if len(order) < size:  # a small corpus: the rest are the lowest unseen ids (BPE's bytes and first merges)
        taken = set(order)
        order += [i for i in range(size + len(ranked)) if i not in taken][:size - len(order)]
    return sorted(order)


def write_export_ranking(files: list[str], export_dir: str) -> str:
    """The shards' token ranking beside a full-vocabulary export (models/vocab_ranking.py: engine.draft_vocab
    chooses its run-time draft vocabulary from it); returns the file's path."""
    from lilicorr.models.vocab_ranking import write_vocab_ranking

    ids, counts = token_ranking(files)
    return str(write_vocab_ranking(export_dir, torch.tensor(ids), torch.tensor(counts)))


def main(argv: Optional[list[str]] = None) -> None:
    """python -m lilicorr.platform.train.data rank DATA_DIR EXPORT_DIR: write the token ranking of DATA_DIR's
    training shards (a corpus or a data.output_dir) beside an export made from them."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lilicorr.platform.train.data", description=main.__doc__)
    p.add_argument("command", choices=["rank"])
    p.add_argument("data_dir")
    p.add_argument("export_dir")
    args = p.parse_args(argv)
    path = write_export_ranking(require_train_files(args.data_dir), args.export_dir)
    print(f"wrote {path}")


def row_seed(row_id: str, seed: int) -> int:
    """A per-row seed independent of order and sharding: validation draws the same anchors anywhere."""
    return (zlib.crc32(str(row_id).encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


def iter_rows_local(files: list[str]) -> Iterator[dict]:
    """Rows of Parquet shards read in this process (validation outside Ray, tests)."""
    import pyarrow.parquet as pq

    for f in files:
        table = pq.read_table(f, columns=COLUMNS)  # local paths and URIs alike
        for row in table.to_pylist():
            yield row


def iter_rows_ray(shard) -> Iterator[dict]:
    """Rows of a Ray Data shard, one dict each (every column the shard has: cached features too)."""
    for batch in shard.iter_batches(batch_size=16, batch_format="numpy"):
        for i in range(len(batch["id"])):
            yield {k: batch[k][i] for k in batch}


if __name__ == "__main__":
    main()
