"""Packaged corpora: a regenerated corpus kept in the repository as a small, versioned, read-only asset.

    python -m lilicorr.platform.corpus pack outputs/corpus-v1 corpora/smollm2-135m/sharegpt-v1
    python -m lilicorr.platform.corpus check corpora/smollm2-135m/sharegpt-v1
    python -m lilicorr.platform.corpus first-turns SRC DEST --end-of-turn 2   # each row's first prompt and answer
    python -m lilicorr.platform.corpus extend BASE REGEN_DIR DEST [--end-of-turn 2]   # BASE + a run past its rows
    python -m lilicorr.platform.corpus since SRC DEST --row 6336   # train on the rows an extension added

Regeneration (jobs/regenerate.py) writes many shards with the conversations' text; training needs only
token ids and loss masks. `pack` keeps those, in one zstd Parquet file per split, and a manifest:
    manifest.json            format, the regeneration's fingerprint (target, source, caps), the source rows
                             it covers, rows and tokens per split, each file's sha256, the corpus fingerprint
    train/part-00000.parquet    id, row_index, input_ids (list<int32>), loss_mask (list<int8>)
    heldout/part-00000.parquet  the same for the held-out conversations (hash-chosen, regenerated alike)
The folder has the layout training reads (`data.output_dir=<it>`), so nothing is regenerated to train,
validate, run the demo or CI. A corpus is never replaced: a later pack goes to a new folder (say -v2), and
when it names the earlier one with `--extends` it must hold every row of it unchanged (checked). `extend` adds a
regeneration run over later source rows (`data.start_row`, same settings) to a corpus without regenerating its rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

FORMAT = "lilicorr-corpus-v1"
MANIFEST = "manifest.json"
SPLITS = ("train", "heldout")
COLUMNS = ["id", "row_index", "input_ids", "loss_mask"]
PART = "part-00000.parquet"


class CorpusError(ValueError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(folder: str | Path) -> dict[str, Any]:
    p = Path(folder) / MANIFEST
    if not p.exists():
        raise CorpusError(f"{folder} is not a packaged corpus (no {MANIFEST}); pack one with "
                          f"`python -m lilicorr.platform.corpus pack REGEN_DIR {folder}`")
    return json.loads(p.read_text())


def is_corpus(folder: str) -> bool:
    return "://" not in folder and (Path(folder) / MANIFEST).exists() and read_manifest(folder).get("format") == FORMAT


def read_table(folder: str | Path, split: str, limit: Optional[int] = None):
    """One split's rows (pyarrow Table, source order); `limit` reads only the first rows (tests read a slice)."""
    import pyarrow.parquet as pq

    path = Path(folder) / split / PART
    if not path.exists():
        raise CorpusError(f"{folder} has no {split} split")
    if limit is None:
        return pq.read_table(path, columns=COLUMNS)
    import pyarrow as pa

    return pa.Table.from_batches([next(pq.ParquetFile(path).iter_batches(batch_size=max(1, limit), columns=COLUMNS))])


def _stats(table) -> dict[str, int]:
    import pyarrow.compute as pc

    return {"rows": table.num_rows, "tokens": int(pc.sum(pc.list_value_length(table["input_ids"])).as_py() or 0),
            "answer_tokens": int(pc.sum(pc.list_flatten(table["loss_mask"])).as_py() or 0)}


def pack(regen_dir: str, dest: str, extends: Optional[str] = None, command: str = "") -> dict[str, Any]:
    """Pack the finished shards of a regeneration run into `dest` (a new folder); returns the manifest."""
    out = _new_folder(dest)
    regen, covered, tables = _regenerated(regen_dir)
    if extends:
        old = read_manifest(extends)
        if not _same_settings(old["regeneration"], regen["fingerprint"]):
            raise CorpusError(f"--extends {extends}: made with other regeneration settings; a corpus extends only "
                              f"one made the same way")
        for split in SPLITS:
            before = read_table(extends, split).to_pylist()
            now = {r["id"]: r for r in tables[split].to_pylist()}
            missing = [r["id"] for r in before if now.get(r["id"]) != r]
            if missing:
                raise CorpusError(f"--extends {extends}: {len(missing)} {split} rows of it are missing or changed "
                                  f"here (first {missing[0]!r}); regenerate into the same output_dir to extend it")
    return _write(out, tables, {"regeneration": regen["fingerprint"], "source": regen.get("source"),
                                "target": regen.get("target"), "source_rows": covered, "extends": extends,
                                "skipped": _skipped(regen["shards"]), "made_by": command})


def first_turns(src: str, dest: str, end_of_turn: int, command: str = "") -> dict[str, Any]:
    """A new corpus of `src`'s rows cut after their first answer: the first prompt and the first answer through its
    end-of-turn token (the row's first loss-masked `end_of_turn`; a capped answer, which has none, to its last
    token). For a corpus whose later turns were generated after answers that ran past their end (a wrong stop
    token): what stays is exactly what the target generated from a well-formed prompt."""
    meta = check(src)
    out = _new_folder(dest)
    tables = {split: _first_turns(read_table(src, split), end_of_turn) for split in SPLITS}
    derived = {"corpus": src, "fingerprint": meta["fingerprint"], "operation": f"first turns, cut at token {end_of_turn}"}
    return _write(out, tables, {**{k: meta.get(k) for k in ("regeneration", "source", "target", "source_rows",
                                                            "skipped")},
                                "extends": None, "derived_from": derived, "made_by": command})


def extend(base: str, regen_dir: str, dest: str, end_of_turn: Optional[int] = None, command: str = "") -> dict[str, Any]:
    """A new corpus `dest`: every row of `base` unchanged, then the rows of a regeneration run over other source rows
    (`data.start_row` past base's) made with base's settings. A base cut to first turns (`first-turns`) takes the
    new rows cut the same way (`end_of_turn`), or made with `data.max_turns=1`."""
    import pyarrow as pa

    old = check(base)
    out = _new_folder(dest)
    regen, covered, new = _regenerated(regen_dir)
    first_only = str((old.get("derived_from") or {}).get("operation", "")).startswith("first turns")
    settings = dict(regen["fingerprint"])
    if first_only:  # base's rows are first turns: the new ones must be too
        if settings.pop("max_turns", None) != 1 and end_of_turn is None:
            raise CorpusError(f"{base} holds first turns only, and {regen_dir} regenerated every turn: give "
                              f"--end-of-turn to cut its rows (or regenerate with data.max_turns=1)")
    if not _same_settings(old["regeneration"], settings):
        raise CorpusError(f"{regen_dir} was made with other regeneration settings than {base} (see both "
                          f"manifests' regeneration / fingerprint); a corpus extends only one made the same way")
    overlap = [[a, b] for a, b in covered for c, d in old["source_rows"] if a < d and c < b]
    if overlap:
        raise CorpusError(f"{regen_dir} regenerated source rows {overlap[0]} that {base} already holds: regenerate "
                          f"from data.start_row={max(d for _, d in old['source_rows'])}")
    if first_only and end_of_turn is not None:  # cut only once the run is known to belong here
        new = {split: _first_turns(t, end_of_turn) for split, t in new.items()}
    tables = {}
    for split in SPLITS:  # base's rows, then the new ones by source row (cast to base's column types)
        before = read_table(base, split)
        tables[split] = pa.concat_tables([before, new[split].cast(before.schema)]).sort_by("row_index")
    skipped = dict(Counter(old.get("skipped") or {}) + Counter(_skipped(regen["shards"])))
    return _write(out, tables, {"regeneration": old["regeneration"], "source": old.get("source"),
                                "target": old.get("target"), "source_rows": _merged(old["source_rows"] + covered),
                                "extends": base, "derived_from": old.get("derived_from"), "skipped": skipped,
                                "made_by": command})


def since(src: str, dest: str, row: int, command: str = "") -> dict[str, Any]:
    """A training folder of `src`'s train rows from source row `row` on (the rows an `extend` added) and its whole
    held-out split, so that a drafter trained on the base continues over the new rows only and is validated on the
    same held-out rows as before. For outputs/, not for shipping: the manifest names `src` and the cut."""
    import pyarrow.compute as pc

    meta = check(src)
    if not any(a <= row < b for a, b in meta["source_rows"]):
        raise CorpusError(f"{src} holds source rows {meta['source_rows']}; --row {row} is not one of them")
    out = _new_folder(dest)
    train = read_table(src, "train")
    tables = {"train": train.filter(pc.greater_equal(train["row_index"], row)), "heldout": read_table(src, "heldout")}
    derived = {"corpus": src, "fingerprint": meta["fingerprint"], "operation": f"train rows from source row {row}"}
    return _write(out, tables, {**{k: meta.get(k) for k in ("regeneration", "source", "target", "skipped")},
                                "source_rows": [[max(a, row), b] for a, b in meta["source_rows"] if b > row],
                                "extends": None, "derived_from": derived, "made_by": command})


def _new_folder(dest: str) -> Path:
    out = Path(dest)
    if out.exists() and any(out.iterdir()):
        raise CorpusError(f"{dest} exists: a packaged corpus is never replaced; write a new folder (e.g. ...-v2)")
    return out


def _regenerated(regen_dir: str) -> tuple[dict[str, Any], list[list[int]], dict[str, Any]]:
    """A regeneration run's manifest, the source row ranges its finished shards cover ([start, stop), adjacent
    shards merged) and each split's rows in the corpus columns, by source row."""
    import pyarrow as pa

    from lilicorr.platform.regenerate.shards import ShardStore, read_split

    regen = ShardStore(regen_dir).read_manifest()
    if not regen or not regen.get("shards"):
        raise CorpusError(f"{regen_dir} has no finished regeneration shards (run jobs/regenerate.py first)")
    covered = _merged([[v["start"], v["stop"]] for v in regen["shards"].values()])
    schema = pa.schema([("id", pa.string()), ("row_index", pa.int64()), ("input_ids", pa.list_(pa.int32())),
                        ("loss_mask", pa.list_(pa.int8()))])
    tables = {split: read_split(regen_dir, split).select(COLUMNS).cast(schema).sort_by("row_index")
              for split in SPLITS}
    return regen, covered, tables


def _merged(ranges: list[list[int]]) -> list[list[int]]:
    """Source row ranges [start, stop), sorted, adjacent ones joined."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return out


def _first_turns(table, end_of_turn: int):
    """Each row cut after its first answer's end-of-turn token (a capped answer, which has none, at its last token);
    rows with no answer are dropped."""
    import pyarrow as pa

    rows = []
    for r in table.to_pylist():
        ids, mask = r["input_ids"], r["loss_mask"]
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is None:
            continue
        end = next((i for i in range(first, len(ids)) if not mask[i]), len(ids))  # the first answer's span
        stop = next((i for i in range(first, end) if ids[i] == end_of_turn), end - 1)
        rows.append({**r, "input_ids": ids[:stop + 1], "loss_mask": mask[:stop + 1]})
    return pa.Table.from_pylist(rows, schema=table.schema)


def _write(out: Path, tables: dict, meta: dict[str, Any]) -> dict[str, Any]:
    """Write the splits' Parquet files and the manifest (their sha256, the corpus fingerprint, the statistics)."""
    import pyarrow.parquet as pq

    files = {}
    for split in SPLITS:
        (out / split).mkdir(parents=True, exist_ok=True)
        path = out / split / PART
        # zstd at a high level: token ids compress ~2x (their high bytes are zero); loss masks to almost nothing
        pq.write_table(tables[split], path, compression="zstd", compression_level=19, row_group_size=1024)
        files[f"{split}/{PART}"] = _sha256(path)
    fingerprint = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
    meta = {"format": FORMAT, "fingerprint": fingerprint, **meta,
            "splits": {s: _stats(tables[s]) for s in SPLITS}, "files": files}
    (out / MANIFEST).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def _same_settings(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Equal regeneration settings, where a key one side lacks matches None on the other: a setting added since the
    earlier corpus was made, at its default (sharegpt-v1 predates target.yarn_factor)."""
    for k in set(old) | set(new):
        a, b = old.get(k), new.get(k)
        if not (_same_settings(a, b) if isinstance(a, dict) and isinstance(b, dict) else a == b):
            return False
    return True


def _skipped(shards: dict[str, dict]) -> dict[str, int]:
    """Rows skipped per reason over a regeneration's shards."""
    return dict(sum((Counter(v.get("skipped") or {}) for v in shards.values()), Counter()))


def check(folder: str) -> dict[str, Any]:
    """The manifest, after checking every file's sha256 against it (a changed asset is refused)."""
    meta = read_manifest(folder)
    if meta.get("format") != FORMAT:
        raise CorpusError(f"{folder}/{MANIFEST}: format {meta.get('format')!r}, expected {FORMAT!r}")
    for name, digest in meta["files"].items():
        path = Path(folder) / name
        if not path.exists() or _sha256(path) != digest:
            raise CorpusError(f"{path} does not match {folder}/{MANIFEST} (missing or changed); a corpus is "
                              f"read-only: restore it from git, or pack a new version")
    return meta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lilicorr.platform.corpus", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="pack a regeneration run's finished shards into a new corpus folder")
    p.add_argument("regen_dir")
    p.add_argument("dest")
    p.add_argument("--extends", default=None, help="the earlier version this one must contain")
    c = sub.add_parser("check", help="verify a corpus folder against its manifest")
    c.add_argument("folder")
    f = sub.add_parser("first-turns", help="a new corpus of each row's first prompt and answer (through its end of turn)")
    f.add_argument("src")
    f.add_argument("dest")
    f.add_argument("--end-of-turn", type=int, required=True, help="the token id an answer ends with (SmolLM2: 2)")
    e = sub.add_parser("extend", help="a new corpus: BASE's rows, then a regeneration run's over later source rows")
    e.add_argument("base")
    e.add_argument("regen_dir")
    e.add_argument("dest")
    e.add_argument("--end-of-turn", type=int, default=None,
                   help="a first-turns BASE: cut the new rows after their first answer's end-of-turn token (SmolLM2: 2)")
    r = sub.add_parser("since", help="a training folder: SRC's train rows from a source row on, its held-out rows all")
    r.add_argument("src")
    r.add_argument("dest")
    r.add_argument("--row", type=int, required=True, help="the first source row kept (an extension's data.start_row)")
    args = ap.parse_args(argv)
    command = "python -m lilicorr.platform.corpus " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        if args.cmd == "pack":
            meta = pack(args.regen_dir, args.dest, args.extends, command=command)
        elif args.cmd == "extend":
            meta = extend(args.base, args.regen_dir, args.dest, args.end_of_turn, command=command)
        elif args.cmd == "since":
            meta = since(args.src, args.dest, args.row, command=command)
        elif args.cmd == "first-turns":
            meta = first_turns(args.src, args.dest, args.end_of_turn, command=command)
        else:
            meta = check(args.folder)
    except CorpusError as e:
        print(f"corpus: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: meta[k] for k in ("fingerprint", "regeneration", "splits", "source_rows")}))


if __name__ == "__main__":
    main()
