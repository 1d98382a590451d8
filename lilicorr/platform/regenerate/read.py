"""Reading conversations for regeneration: sources, deterministic shards, the train/held-out split.

A source is read in shards of `data.rows_per_shard` consecutive rows (shard s holds source rows
[s*R, (s+1)*R)), so a shard's content depends only on the source and R, never on timing: a rerun
rebuilds exactly the same shards and can skip the finished ones. Each Ray task reads one shard's
slice of the source (`read_shard_rows`), so the driver never holds the corpus.

Rows leave here raw: {"row_index", "id", "split", "shard", "turns" (JSON text of the source's turn
list), "error"}. Normalising the turns (ShareGPT `from/value` or OpenAI `role/content`) happens in the
generator actor, where a bad row is counted by reason instead of failing the read.

Sources (`data.source`):
  - "embedded:sharegpt"   the packaged ShareGPT V3 as Parquet (assets.sharegpt_parquet)
  - "hf:<repo id>"        a Hugging Face dataset; every split except multilingual ones (the paper
                          drops Nemotron V2's multilingual splits), concatenated in sorted split order
  - "<path>.jsonl"        one JSON object per line
  - "<path>.json"         a JSON array of objects
  - "<path>.parquet"      a Parquet file
Each row's turns come from its `messages` or `conversations` column (first present); its id from
`id`, `uuid` or `conversation_id`, else "row-<index>".
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

TURN_COLUMNS = ("messages", "conversations", "conversation")
ID_COLUMNS = ("id", "uuid", "conversation_id")


@dataclass(frozen=True)
class Source:
    kind: str  # "parquet" | "jsonl" | "json" | "hf"
    location: str  # a file path, or a hub repo id for "hf"
    name: str  # what the user wrote in data.source (recorded in the manifest)


@dataclass(frozen=True)
class ShardTask:
    shard: int
    start: int  # first source row (inclusive)
    stop: int  # last source row (exclusive)
    byte_offset: int = 0  # JSONL only: where line `start` begins, so a task seeks instead of scanning


def resolve_source(name: str) -> Source:
    if name == "embedded:sharegpt":
        from lilicorr.platform.assets import sharegpt_parquet

        return Source("parquet", str(sharegpt_parquet()), name)
    if name.startswith("hf:"):
        return Source("hf", name.removeprefix("hf:"), name)
    for suffix, kind in ((".jsonl", "jsonl"), (".json", "json"), (".parquet", "parquet")):
        if name.endswith(suffix):
            if not os.path.exists(name):
                raise FileNotFoundError(f"data.source {name!r} does not exist")
            return Source(kind, os.path.abspath(name), name)
    raise ValueError(f"unknown data.source {name!r}; use embedded:sharegpt, hf:<repo id>, "
                     f"or a .jsonl / .json / .parquet path")


# ----------------------------------------------------------------------------- planning (driver)


def count_rows(src: Source) -> int:
    if src.kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(src.location).metadata.num_rows
    if src.kind == "jsonl":
        with open(src.location, "rb") as f:
            return sum(1 for _ in f)
    if src.kind == "json":
        return len(_json_rows(src.location))
    return len(_hf_rows(src.location))


def plan_shards(src: Source, num_rows: int, rows_per_shard: int, start_row: int = 0) -> list[ShardTask]:
    """Shard s = source rows [s*R, min((s+1)*R, num_rows)), from the shard holding start_row (a multiple of R: the
    numbering stays that of a run from row 0, so the two runs' shards are the same); JSONL shards carry their byte
    offset."""
    if rows_per_shard < 1:
        raise ValueError(f"data.rows_per_shard must be >= 1, got {rows_per_shard}")
    starts = list(range(start_row, num_rows, rows_per_shard))
    offsets = _jsonl_offsets(src.location, starts) if src.kind == "jsonl" else [0] * len(starts)
    return [ShardTask(s // rows_per_shard, s, min(s + rows_per_shard, num_rows), off)
            for s, off in zip(starts, offsets)]


def _jsonl_offsets(path: str, line_numbers: list[int]) -> list[int]:
    wanted, out, pos = set(line_numbers), {}, 0
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i in wanted:
                out[i] = pos
            pos += len(line)
    return [out.get(n, pos) for n in line_numbers]


# ----------------------------------------------------------------------------- split


def split_of(conversation_id: str, heldout_fraction: float) -> str:
    """"heldout" for a fixed, hash-chosen fraction of conversations, else "train".

    ShareGPT cuts long chats into parts "<id>_0", "<id>_1", ...; the suffix is dropped before hashing
    so all parts of one chat land on the same side and held-out text never leaks into training.
    """
    key = re.sub(r"_\d+$", "", conversation_id)
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64  # uniform in [0, 1)
    return "heldout" if h < heldout_fraction else "train"


# ----------------------------------------------------------------------------- reading (Ray tasks)


def read_shard_rows(task: dict[str, Any], *, src: Source, heldout_fraction: float) -> list[dict[str, Any]]:
    """The raw rows of one shard (a Ray Data flat_map over ShardTask dicts)."""
    start, stop, shard = int(task["start"]), int(task["stop"]), int(task["shard"])
    if src.kind == "parquet":
        records = _parquet_table(src.location).slice(start, stop - start).to_pylist()
    elif src.kind == "jsonl":
        records = _jsonl_slice(src.location, int(task["byte_offset"]), stop - start)
    elif src.kind == "json":
        records = _json_rows(src.location)[start:stop]
    else:
        records = _hf_rows(src.location).select(range(start, stop)).to_list()
    if len(records) != stop - start:
        raise RuntimeError(f"shard {shard}: expected {stop - start} rows from {src.name}, read {len(records)}")
    out = []
    for i, rec in enumerate(records):
        row_index = start + i
        conv_id, turns, error = _fields(rec, row_index)
        out.append({"row_index": row_index, "id": conv_id, "split": split_of(conv_id, heldout_fraction),
                    "shard": shard, "turns": json.dumps(turns, ensure_ascii=False, default=str), "error": error or ""})
    return out


def _fields(rec: Any, row_index: int) -> tuple[str, Any, Optional[str]]:
    """(id, raw turn list, error) of one source record; never raises."""
    if isinstance(rec, _BadLine):
        return f"row-{row_index}", None, rec.reason
    if not isinstance(rec, dict):
        return f"row-{row_index}", None, f"row is {type(rec).__name__}, not an object"
    conv_id = next((str(rec[c]) for c in ID_COLUMNS if rec.get(c) not in (None, "")), f"row-{row_index}")
    turns = next((rec[c] for c in TURN_COLUMNS if c in rec), None)
    error = rec.get("error") or None  # the embedded Parquet records conversion failures here
    if turns is None and error is None:
        error = f"no {'/'.join(TURN_COLUMNS)} field"
    return conv_id, turns, error


@dataclass
class _BadLine:
    reason: str


def _jsonl_slice(path: str, byte_offset: int, count: int) -> list[Any]:
    out: list[Any] = []
    with open(path, "rb") as f:
        f.seek(byte_offset)
        for _ in range(count):
            line = f.readline()
            if not line:
                break
            try:
                out.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                out.append(_BadLine(f"invalid JSON line: {e}"))
    return out


# Per worker process: a Ray worker reading several shards opens the source once.
@functools.lru_cache(maxsize=2)
def _parquet_table(path: str):
    import pyarrow.parquet as pq

    return pq.read_table(path, memory_map=True)


@functools.lru_cache(maxsize=2)
def _json_rows(path: str) -> list[Any]:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON array of conversations")
    return rows


@functools.lru_cache(maxsize=2)
def _hf_rows(repo: str):
    """All non-multilingual splits of a hub dataset, concatenated in sorted split order."""
    from lilicorr.platform.assets import AssetUnavailable, require_hub

    require_hub(f"data.source hf:{repo}")  # offline: fails now, naming the packaged sources
    import datasets


    try:
        names = datasets.get_dataset_split_names(repo)
        # Only the splits we keep are downloaded (paper §4.1: multilingual splits excluded).
        parts = [datasets.load_dataset(repo, split=name) for name in sorted(names) if "multilingual" not in name.lower()]
    except Exception as e:  # noqa: BLE001 — any hub failure gets the same clear message
        raise AssetUnavailable(f"dataset {repo!r} could not be loaded from the hub (offline?): "
                               f"{type(e).__name__}: {e}") from None
    if not parts:
        raise ValueError(f"hf:{repo} has no non-multilingual split (splits: {', '.join(names)})")
    keep = [[c for c in ds.column_names if c in TURN_COLUMNS + ID_COLUMNS] for ds in parts]
    return datasets.concatenate_datasets([ds.select_columns(k) for ds, k in zip(parts, keep)])
