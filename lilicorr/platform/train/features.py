"""The target feature cache: the frozen target's teacher-forced states, computed once per training row.

On CPU the frozen target's pass is most of a training step (docs/design.md §3), and an epoch repeats it for
every row. `train.feature_cache=true` runs it once, as a Ray Data stage (one actor holding the target),
and stores per row exactly what JointModel needs from the target (`TargetPass`):
  captured      (T, n*H)  the captured layers' outputs (the drafter's context, the heads' target state)
  final_hidden  (T, H)    the final-normed hidden state; the target's logits are lm_head(final_hidden)
as raw bytes in `train.feature_dtype` (bf16 by default; fp32 reproduces live training exactly), beside
the shards: `<data.output_dir>/features-<fingerprint>/{train,heldout}/*.parquet` + `manifest.json` (or under
`train.feature_cache_dir`, for a read-only packaged corpus).
The fingerprint covers everything the states depend on (target, captured layers, dtype, seq_len, the
shards' names and sizes), so a changed setting builds a new cache and a finished one is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from lilicorr.config import Config
from lilicorr.platform.assets import target_hf_config
from lilicorr.platform.train.data import COLUMNS, SPLITS, split_files

FEATURE_COLUMNS = ["captured", "final_hidden"]
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def capture_ids_for(cfg: Config) -> list[int]:
    from lilicorr.models.target import drafter_capture_ids
    return drafter_capture_ids(target_hf_config(cfg.target), cfg.drafter)


def fingerprint(cfg: Config, capture_ids: list[int]) -> str:
    shards = []
    for split in SPLITS:
        for f in split_files(cfg.data.output_dir, split):
            shards.append((split, os.path.basename(f), os.path.getsize(f) if "://" not in f else None))
    key = {"target": cfg.target.source, "arch": cfg.target.arch, "target_dtype": cfg.target.dtype,
           "capture_ids": capture_ids, "dtype": cfg.train.feature_dtype, "seq_len": cfg.train.seq_len,
           "shards": shards, "version": 1}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir(cfg: Config, capture_ids: list[int]) -> str:
    return os.path.join(cfg.train.feature_cache_dir or cfg.data.output_dir, f"features-{fingerprint(cfg, capture_ids)}")


def encode(t: torch.Tensor, dtype: str) -> bytes:
    """The tensor's raw bytes in `dtype` (numpy has no bfloat16: they leave as bytes)."""
    return t.detach().to(_DTYPES[dtype]).contiguous().view(torch.uint8).numpy().tobytes()


def decode(b: bytes, dtype: str, width: int) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=_DTYPES[dtype]).view(-1, width)


class TargetFeaturizer:
    """Ray Data actor: rows (id, input_ids, loss_mask) -> the same rows + their target states as bytes."""

    def __init__(self, cfg_dict: dict):
        from lilicorr.models.target import TargetAdapter
        from lilicorr.platform.assets import load_target

        self.cfg = Config.from_dict(cfg_dict)
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        hf, _ = load_target(self.cfg.target)
        self.adapter = TargetAdapter(hf, capture_ids_for(self.cfg))

    def __call__(self, batch: dict):
        import pyarrow as pa

        out = {k: [] for k in COLUMNS + FEATURE_COLUMNS}
        T = self.cfg.train.seq_len
        dtype = self.cfg.train.feature_dtype
        for i in range(len(batch["id"])):
            ids = np.asarray(batch["input_ids"][i], dtype=np.int64)[:T]
            tp = self.adapter.teacher_forced(torch.from_numpy(ids)[None])
            out["id"].append(str(batch["id"][i]))
            out["input_ids"].append(ids.astype(np.int32).tolist())
            out["loss_mask"].append(np.asarray(batch["loss_mask"][i], dtype=np.int8)[:T].tolist())
            out["captured"].append(encode(tp.captured[0], dtype))
            out["final_hidden"].append(encode(tp.final_hidden[0], dtype))
        # An explicit Arrow schema: numpy object arrays would turn equal-length rows into fixed-shape
        # tensors in one batch and variable-shaped ones in the next, which Ray Data cannot concatenate.
        schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                            ("captured", pa.binary()), ("final_hidden", pa.binary())])
        return pa.table(out, schema=schema)


def build_feature_cache(cfg: Config, log=print) -> str:
    """The cache folder for cfg's shards and target, built now by Ray Data if it does not exist yet."""
    import ray.data

    from lilicorr.platform.train.data import ray_datasets

    ids = capture_ids_for(cfg)
    out = cache_dir(cfg, ids)
    manifest = Path(out) / "manifest.json"
    if manifest.exists():
        log(f"feature cache: reusing {out}")
        return out
    if os.path.exists(out):  # an interrupted build: no manifest, so its files are incomplete
        import shutil

        log(f"feature cache: removing the incomplete {out}")
        shutil.rmtree(out)
    start = time.perf_counter()
    counts = {}
    for split, ds in ray_datasets(cfg.data.output_dir, in_memory=True).items():
        counts[split] = ds.count()
        ds = ds.map_batches(TargetFeaturizer, fn_constructor_args=(cfg.to_dict(),), batch_size=8,
                            batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
        ds.write_parquet(os.path.join(out, split))
        log(f"feature cache: {split} {counts[split]} rows done ({time.perf_counter() - start:.0f}s)")
    hidden = target_hf_config(cfg.target).hidden_size
    stats = channel_rms(out, cfg.train.feature_dtype, len(ids) * hidden)
    meta = {"fingerprint": os.path.basename(out).split("-", 1)[1], "target": cfg.target.source,
            "capture_ids": ids, "hidden_size": hidden, "dtype": cfg.train.feature_dtype, "seq_len": cfg.train.seq_len,
            "rows": counts, "build_s": round(time.perf_counter() - start, 1), "channel_rms": stats}
    manifest.write_text(json.dumps(meta))  # written last: its presence means the cache is complete
    log(f"feature cache: built {out} in {meta['build_s']}s")
    return out


def channel_rms(out: str, dtype: str, width: int, max_rows: int = 64) -> list[float]:
    """Per-channel RMS (width,) of the captured states over (up to) the first `max_rows` training rows."""
    import pyarrow.parquet as pq

    states = (decode(row["captured"], dtype, width) for f in split_files(out, "train")
              for row in pq.read_table(f, columns=["captured"]).to_pylist())
    return _rms(states, max_rows)


def live_channel_rms(cfg: Config, hf_model, max_rows: int = 64) -> list[float]:
    """The same statistics without a cache (train.feature_cache=false): `hf_model`'s (the target's) captured states
    of the first `max_rows` training rows, cropped to train.seq_len, so drafter.feature_scaling works on either path."""
    from lilicorr.models.target import TargetAdapter
    from lilicorr.platform.train.data import iter_rows_local

    adapter = TargetAdapter(hf_model, capture_ids_for(cfg))
    T = cfg.train.seq_len
    rows = iter_rows_local(split_files(cfg.data.output_dir, "train"))
    with torch.no_grad():
        return _rms((adapter.teacher_forced(torch.tensor(r["input_ids"][:T])[None]).captured[0] for r in rows),
                    max_rows)


def _rms(states, max_rows: int) -> list[float]:
    """Per-channel RMS over the rows of `states` (each (T, width)), the first `max_rows` of them."""
    sq, n = None, 0
    for i, x in enumerate(states):
        if i >= max_rows:
            break
        x = x.double()
        sq = (x ** 2).sum(0) if sq is None else sq + (x ** 2).sum(0)
        n += x.shape[0]
    if sq is None:
        raise ValueError("drafter.feature_scaling: no training rows to measure the captured states' channel statistics "
                         "on (data.output_dir/train is empty)")
    return (sq / max(n, 1)).sqrt().tolist()


def read_manifest(directory: str) -> Optional[dict]:
    p = Path(directory) / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else None


@dataclass
class FeatureSpec:
    """How to decode a cache's rows: storage dtype, captured width (n*H) and hidden size H."""

    dtype: str
    width: int
    hidden: int

    @classmethod
    def from_manifest(cls, meta: dict) -> "FeatureSpec":
        return cls(meta["dtype"], len(meta["capture_ids"]) * meta["hidden_size"], meta["hidden_size"])

    def row(self, row: dict, T: int):
        """TargetPass (1, T, ...) of one row dict, cropped to T."""
        from lilicorr.models.target import TargetPass

        c = decode(row["captured"], self.dtype, self.width)[:T].float()
        h = decode(row["final_hidden"], self.dtype, self.hidden)[:T].float()
        return TargetPass(captured=c[None], final_hidden=h[None])

    def batch(self, batch: dict, T: int):
        """TargetPass (N, T, ...) of a numpy batch, zero-padded (padding carries no anchor and no label)."""
        from lilicorr.models.target import TargetPass

        N = len(batch["captured"])
        captured, final = torch.zeros(N, T, self.width), torch.zeros(N, T, self.hidden)
        for i in range(N):
            one = self.row({"captured": batch["captured"][i], "final_hidden": batch["final_hidden"][i]}, T)
            t = one.captured.shape[1]
            captured[i, :t], final[i, :t] = one.captured[0], one.final_hidden[0]
        return TargetPass(captured=captured, final_hidden=final)
