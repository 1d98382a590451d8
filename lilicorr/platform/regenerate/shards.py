"""Output of regeneration: Parquet shards written atomically, and a manifest of finished shards.

Layout under `data.output_dir` (a local path or any pyarrow filesystem URI, e.g. s3://bucket/dir):
    manifest.json                  source, target, config, the shard plan, finished shards + counts
    train/shard-00003.parquet      the shard's regenerated training conversations
    heldout/shard-00003.parquet    the shard's held-out conversations (absent when it has none)

A shard's files are written to a temporary name and renamed into place; only then is the shard added
to the manifest (itself replaced atomically). A run killed at any point leaves either a finished
shard listed in the manifest, or files that the next run rewrites with identical content — so a rerun
neither loses nor duplicates rows. The manifest's fingerprint pins everything that decides a shard's
content; resuming with a different one is refused rather than mixing two corpora.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Optional

SPLITS = ("train", "heldout")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1

# Columns written to the shard files (the actor's bookkeeping columns stay out).
SHARD_COLUMNS = ["id", "row_index", "messages", "input_ids", "loss_mask", "num_assistant_turns",
                 "generated_tokens", "turns_capped", "turns_dropped"]


def fingerprint(cfg) -> dict[str, Any]:
    """Every setting a shard's content depends on (data.start_row and data.limit only decide which shards exist)."""
    d = cfg.data
    fp = {"format": FORMAT_VERSION, "source": d.source, "rows_per_shard": d.rows_per_shard,
          "heldout_fraction": d.heldout_fraction, "max_new_tokens": d.max_new_tokens,
          "max_prompt_tokens": d.max_prompt_tokens, "target": cfg.to_dict()["target"]}
    if d.max_turns is not None:  # absent at its default, so runs made before the setting keep their fingerprint
        fp["max_turns"] = d.max_turns
    return fp


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}.parquet"


class ShardStore:
    def __init__(self, output_dir: str):
        import pyarrow.fs as pafs

        if "://" in output_dir:
            self.fs, self.root = pafs.FileSystem.from_uri(output_dir)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(output_dir)
        self.uri = output_dir
        self.manifest: dict[str, Any] = {}

    # ------------------------------------------------------------------ manifest

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def read_manifest(self) -> Optional[dict[str, Any]]:
        if not self._exists(self.path(MANIFEST)):
            return None
        with self.fs.open_input_stream(self.path(MANIFEST)) as f:
            return json.loads(f.read().decode("utf-8"))

    def open(self, cfg, num_rows: int, num_shards: int) -> dict[str, Any]:
        """Load (or start) the manifest for this run; refuses a different fingerprint."""
        self.fs.create_dir(self.root, recursive=True)
        self._remove_temporaries()
        fp = fingerprint(cfg)
        old = self.read_manifest()
        if old is not None and old.get("format") == "lilicorr-corpus-v1":  # lilicorr.platform.corpus.FORMAT
            raise RuntimeError(f"{self.uri} is a packaged corpus (read-only); regenerate into another "
                               f"data.output_dir, then pack it into a new corpus folder")
        if old is not None and old.get("fingerprint") != fp:
            changed = sorted(k for k in fp if old.get("fingerprint", {}).get(k) != fp[k])
            raise RuntimeError(f"{self.uri} holds a corpus made with different settings ({', '.join(changed)}); "
                               f"choose another data.output_dir or delete it")
        self.manifest = old or {"fingerprint": fp, "shards": {}}
        self.manifest.update({"source": cfg.data.source, "target": cfg.target.source, "config": cfg.to_dict(),
                              "num_rows": num_rows, "num_shards": num_shards})
        self._write_manifest()
        return self.manifest

    def is_finished(self, shard: int, start: int, stop: int) -> bool:
        entry = self.manifest.get("shards", {}).get(str(shard))
        return bool(entry) and entry["start"] == start and entry["stop"] == stop and all(
            self._exists(self.path(split, shard_name(shard))) for split in entry["files"])

    def finished_entries(self) -> dict[int, dict[str, Any]]:
        n = self.manifest.get("num_shards", 0)
        return {int(k): v for k, v in self.manifest.get("shards", {}).items() if int(k) < n}

    # ------------------------------------------------------------------ shards

    def write_shard(self, shard: int, start: int, stop: int, tables: dict[str, Any], counts: dict[str, Any]) -> None:
        """Write each non-empty split table of `shard`, then record the shard as finished."""
        import pyarrow.parquet as pq

        files = []
        for split in SPLITS:
            table = tables.get(split)
            if table is None or table.num_rows == 0:
                continue
            final = self.path(split, shard_name(shard))
            self.fs.create_dir(self.path(split), recursive=True)
            tmp = f"{final}.tmp-{uuid.uuid4().hex}"
            with self.fs.open_output_stream(tmp) as f:
                pq.write_table(table.select(SHARD_COLUMNS), f)
            self.fs.move(tmp, final)  # atomic replace on local and POSIX filesystems
            files.append(split)
        self.manifest["shards"][str(shard)] = {"start": start, "stop": stop, "files": files, **counts}
        self._write_manifest()

    def _write_manifest(self) -> None:
        final = self.path(MANIFEST)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(self.manifest, indent=1, sort_keys=True).encode("utf-8"))
        self.fs.move(tmp, final)

    def _exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(path).type == pafs.FileType.File

    def _remove_temporaries(self) -> None:
        """Half-written files of a killed run (never listed in the manifest)."""
        import pyarrow.fs as pafs

        for sub in (self.root, *[self.path(s) for s in SPLITS]):
            if self.fs.get_file_info(sub).type != pafs.FileType.Directory:
                continue
            for info in self.fs.get_file_info(pafs.FileSelector(sub)):
                if ".tmp-" in info.base_name:
                    self.fs.delete_file(info.path)


def read_split(output_dir: str, split: str = "train"):
    """All rows of one split as a pyarrow Table, in source order (for training and tests)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = ShardStore(output_dir)
    manifest = store.read_manifest() or {"shards": {}}
    tables = [pq.read_table(store.fs.open_input_file(store.path(split, shard_name(int(k)))))
              for k, v in sorted(manifest["shards"].items(), key=lambda kv: int(kv[0])) if split in v["files"]]
    if not tables:
        return pa.table({c: [] for c in SHARD_COLUMNS})
    return pa.concat_tables(tables)
