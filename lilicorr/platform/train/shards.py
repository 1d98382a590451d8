"""Training shards without regeneration: a fixed synthetic corpus (tests) and ShareGPT as-is (smoke runs).

Both write the layout the regeneration job produces and training reads:
`out_dir/{train,heldout}/shard-NNNNN.parquet` with columns id, input_ids (list<int32>), loss_mask
(list<int8>). Not a substitute for regeneration (paper §4.1): as-is ShareGPT answers are not the
target's own outputs; use it only to exercise the training stack before regenerated data exists.

    python -m lilicorr.platform.train.shards --preset smollm2-135m --limit 64 --out /tmp/sharegpt-asis
"""

from __future__ import annotations

import argparse
import random
import zlib
from pathlib import Path


def write_shards(rows: list[dict], out_dir: str | Path, split: str, rows_per_shard: int) -> list[Path]:
    """rows: {"id", "input_ids", "loss_mask"} -> Parquet shards under out_dir/split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])
    d = Path(out_dir) / split
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(0, len(rows), rows_per_shard):
        chunk = rows[k:k + rows_per_shard]
        table = pa.table({c: [r[c] for r in chunk] for c in ("id", "input_ids", "loss_mask")}, schema=schema)
        path = d / f"shard-{k // rows_per_shard:05d}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def synthetic_rows(n: int, vocab_size: int, min_len: int, max_len: int, seed: int, prefix: str = "syn") -> list[dict]:
    """A fixed, learnable corpus: a short prompt (unmasked) then a masked answer that counts up by a
    per-row stride through a 200-token window, so the next tokens are predictable from the context."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        length = rng.randint(min_len, max_len)
        prompt = rng.randint(2, 5)
        base, stride = rng.randrange(vocab_size - 200), rng.randint(1, 3)
        ids = [rng.randrange(vocab_size) for _ in range(prompt)]
        ids += [base + (stride * j) % 200 for j in range(length - prompt)]
        rows.append({"id": f"{prefix}-{i}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt)})
    return rows


def sharegpt_as_is_rows(tokenizer, limit: int, stop_id: int) -> list[dict]:
    """The first `limit` usable ShareGPT conversations tokenized with their own answers (loss on answers)."""
    import pyarrow.parquet as pq

    from lilicorr.platform.assets import sharegpt_parquet
    from lilicorr.platform.regenerate.conversations import (AssistantTurn, SkipConversation, conversation_skeleton,
                                                   tokenize_with_loss_mask)

    rows = []
    table = pq.read_table(sharegpt_parquet(), columns=["id", "messages"])
    for rec in table.slice(0, max(limit * 4, limit + 16)).to_pylist():
        if len(rows) >= limit:
            break
        try:
            msgs = conversation_skeleton(rec["messages"])
            turns = [AssistantTurn(list(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + [stop_id], True)
                     for m in msgs if m["role"] == "assistant"]
            ids, mask = tokenize_with_loss_mask(tokenizer, msgs, turns, [stop_id], enable_thinking=False)
        except (SkipConversation, ValueError):
            continue
        rows.append({"id": rec["id"], "input_ids": ids, "loss_mask": mask})
    return rows


def split_rows(rows: list[dict], heldout_fraction: float) -> dict[str, list[dict]]:
    """Deterministic split by id hash (the same id always lands in the same split)."""
    out: dict[str, list[dict]] = {"train": [], "heldout": []}
    for r in rows:
        key = "heldout" if (zlib.crc32(r["id"].encode()) % 1000) < heldout_fraction * 1000 else "train"
        out[key].append(r)
    return out


def main(argv=None) -> None:
    from lilicorr.config import load_config
    from lilicorr.platform.assets import eos_token_ids, load_target

    p = argparse.ArgumentParser(description="ShareGPT conversations tokenized as-is into training shards")
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = load_config(args.preset)
    _, tokenizer = load_target(cfg.target)
    rows = sharegpt_as_is_rows(tokenizer, args.limit, eos_token_ids(cfg.target, tokenizer)[0])
    for split, part in split_rows(rows, cfg.data.heldout_fraction).items():
        write_shards(part, args.out, split, cfg.data.rows_per_shard)
        print(f"{split}: {len(part)} rows, {sum(len(r['input_ids']) for r in part)} tokens")


if __name__ == "__main__":
    main()
