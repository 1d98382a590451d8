"""The packaged corpus: packing a regeneration run, the read-only checks, extending, and the shipped asset itself
(a slice: its manifest, and that its answers are the target's own greedy continuations)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lilicorr.config import load_config
from lilicorr.platform.corpus import (CorpusError, check, extend, first_turns, is_corpus, pack, read_manifest,
                                      read_table, since)
from lilicorr.platform.regenerate.shards import ShardStore

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ROOT / "corpora" / "smollm2-135m"
# v1 regenerated on 2 CPU cores, v2 on one GPU, v3 = v2 + later rows regenerated on 2 CPU cores (corpus extend), v4 = v3
# + the rows after v3's, the same way, v5 = v4 + the rows after v4's
SHIPPED = [CORPORA / f"sharegpt-v{n}" for n in range(1, 6)]


def _rows(start: int, n: int, split: str) -> pa.Table:
    return pa.Table.from_pylist([
        {"id": f"c{i}", "row_index": i, "messages": [{"role": "user", "content": "q"}],
         "input_ids": [1, 2, 3, 10 + i, 11 + i], "loss_mask": [0, 0, 0, 1, 1], "num_assistant_turns": 1,
         "generated_tokens": 2, "turns_capped": 0, "turns_dropped": 0} for i in range(start, start + n)])


def _regen_dir(tmp: Path, shards: int, first: int = 0, overrides: tuple = ()) -> str:
    cfg = load_config("tiny-random", [f"data.output_dir={tmp}", "data.rows_per_shard=4", *overrides])
    store = ShardStore(str(tmp))
    store.open(cfg, 4 * shards, shards)
    for s in range(first, shards):
        store.write_shard(s, 4 * s, 4 * s + 4, {"train": _rows(4 * s, 3, "train"), "heldout": _rows(4 * s + 3, 1, "heldout")},
                          {"rows": 4, "kept": 4, "skipped": {"prompt_too_long": s}})
    return str(tmp)


def test_pack_counts_checks_and_refuses_to_replace(tmp_path):
    regen = _regen_dir(tmp_path / "regen", 2)
    dest = tmp_path / "corpus-v1"
    meta = pack(regen, str(dest))
    assert meta["splits"]["train"] == {"rows": 6, "tokens": 30, "answer_tokens": 12}
    assert meta["splits"]["heldout"] == {"rows": 2, "tokens": 10, "answer_tokens": 4}
    assert meta["source_rows"] == [[0, 8]]  # adjacent shards merged
    assert meta["skipped"] == {"prompt_too_long": 1}
    assert is_corpus(str(dest)) and check(str(dest))["fingerprint"] == meta["fingerprint"]
    t = read_table(dest, "train")
    assert t["row_index"].to_pylist() == [0, 1, 2, 4, 5, 6] and t.schema.field("input_ids").type == pa.list_(pa.int32())
    assert read_table(dest, "heldout", limit=1).num_rows == 1
    with pytest.raises(CorpusError, match="never replaced"):
        pack(regen, str(dest))
    # a changed file is refused, naming the fix
    part = dest / "train" / "part-00000.parquet"
    part.write_bytes(part.read_bytes() + b"x")
    with pytest.raises(CorpusError, match="restore it from git"):
        check(str(dest))
    # training's shard reader and regeneration's store see the folder as training data / a read-only corpus
    from lilicorr.platform.train.data import count_rows, split_files

    assert count_rows(split_files(str(dest), "heldout")) == 2
    with pytest.raises(RuntimeError, match="packaged corpus"):
        ShardStore(str(dest)).open(load_config("tiny-random"), 8, 2)


def test_extends_must_keep_every_earlier_row(tmp_path):
    regen = _regen_dir(tmp_path / "regen", 1)
    pack(regen, str(tmp_path / "v1"))
    # made before a setting existed: the key is absent from v1's manifest and None (its default) now
    manifest = tmp_path / "v1" / "manifest.json"
    old = json.loads(manifest.read_text())
    assert old["regeneration"]["target"].pop("yarn_factor") is None
    manifest.write_text(json.dumps(old))
    regen2 = _regen_dir(tmp_path / "regen2", 2)  # the same first shard, one more
    meta = pack(regen2, str(tmp_path / "v2"), extends=str(tmp_path / "v1"))
    assert meta["extends"] == str(tmp_path / "v1") and meta["splits"]["train"]["rows"] == 6
    # a regeneration whose first shard came out differently cannot claim to extend v1
    other = tmp_path / "regen3"
    _regen_dir(other, 2)
    store = ShardStore(str(other))
    store.manifest = store.read_manifest()
    bad = pa.Table.from_pylist([{**r, "input_ids": [9] * 5} for r in _rows(0, 3, "train").to_pylist()])
    store.write_shard(0, 0, 4, {"train": bad, "heldout": _rows(3, 1, "heldout")}, {"rows": 4, "kept": 4})
    with pytest.raises(CorpusError, match="missing or changed"):
        pack(str(other), str(tmp_path / "v2b"), extends=str(tmp_path / "v1"))


def test_first_turns_cuts_each_row_after_its_first_answers_end_of_turn(tmp_path):
    regen = tmp_path / "regen"
    cfg = load_config("tiny-random", [f"data.output_dir={regen}", "data.rows_per_shard=4"])
    store = ShardStore(str(regen))
    store.open(cfg, 4, 1)
    base = _rows(0, 4, "train").to_pylist()
    ran_past = {**base[0], "input_ids": [1, 7, 3, 10, 2, 198, 1], "loss_mask": [0, 0, 0, 1, 1, 1, 1]}
    capped = {**base[1], "input_ids": [1, 7, 3, 10, 11], "loss_mask": [0, 0, 0, 1, 1]}
    two_turns = {**base[2], "input_ids": [5, 6, 10, 2, 7, 8, 11, 2], "loss_mask": [0, 0, 1, 1, 0, 0, 1, 1]}
    store.write_shard(0, 0, 4, {"train": pa.Table.from_pylist([ran_past, capped, two_turns]),
                                "heldout": _rows(3, 1, "heldout")}, {"rows": 4, "kept": 4})
    pack(str(regen), str(tmp_path / "v1"))
    meta = first_turns(str(tmp_path / "v1"), str(tmp_path / "ft"), end_of_turn=2)
    got = [(r["input_ids"], r["loss_mask"]) for r in read_table(str(tmp_path / "ft"), "train").to_pylist()]
    assert got == [([1, 7, 3, 10, 2], [0, 0, 0, 1, 1]), ([1, 7, 3, 10, 11], [0, 0, 0, 1, 1]), ([5, 6, 10, 2], [0, 0, 1, 1])]
    assert meta["derived_from"]["fingerprint"] == read_manifest(str(tmp_path / "v1"))["fingerprint"]
    assert check(str(tmp_path / "ft"))["splits"]["train"]["answer_tokens"] == 2 + 2 + 2


def test_extend_adds_a_run_over_later_rows_and_keeps_every_earlier_row(tmp_path):
    pack(_regen_dir(tmp_path / "regen", 1), str(tmp_path / "v1"))
    later = _regen_dir(tmp_path / "later", 3, first=1)  # shards 1-2 only: a run with data.start_row=4
    meta = extend(str(tmp_path / "v1"), later, str(tmp_path / "v2"))
    assert meta["source_rows"] == [[0, 12]] and meta["extends"] == str(tmp_path / "v1")
    assert meta["splits"]["train"]["rows"] == 9 and meta["skipped"] == {"prompt_too_long": 0 + 1 + 2}
    t = read_table(str(tmp_path / "v2"), "train")
    assert t["row_index"].to_pylist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert t.slice(0, 3).to_pylist() == read_table(str(tmp_path / "v1"), "train").to_pylist()  # v1's rows unchanged
    assert check(str(tmp_path / "v2"))["fingerprint"] == meta["fingerprint"]
    with pytest.raises(CorpusError, match="already holds"):  # rows v1 has: not an extension
        extend(str(tmp_path / "v1"), _regen_dir(tmp_path / "again", 2), str(tmp_path / "v2b"))
    with pytest.raises(CorpusError, match="other regeneration settings"):
        extend(str(tmp_path / "v1"), _regen_dir(tmp_path / "other", 2, first=1, overrides=("data.max_new_tokens=7",)),
               str(tmp_path / "v2c"))
    # a first-turns base takes first turns only: cut by --end-of-turn, or regenerated with data.max_turns=1
    first_turns(str(tmp_path / "v1"), str(tmp_path / "ft"), end_of_turn=2)
    with pytest.raises(CorpusError, match="first turns only"):
        extend(str(tmp_path / "ft"), later, str(tmp_path / "ft2"))
    meta = extend(str(tmp_path / "ft"), later, str(tmp_path / "ft2"), end_of_turn=2)
    assert meta["derived_from"]["operation"] == "first turns, cut at token 2" and meta["splits"]["train"]["rows"] == 9
    one_turn = _regen_dir(tmp_path / "one", 3, first=1, overrides=("data.max_turns=1",))
    assert extend(str(tmp_path / "ft"), one_turn, str(tmp_path / "ft3"))["source_rows"] == [[0, 12]]


def test_since_keeps_the_train_rows_from_a_source_row_on_and_every_heldout_row(tmp_path):
    pack(_regen_dir(tmp_path / "regen", 3), str(tmp_path / "v1"))
    meta = since(str(tmp_path / "v1"), str(tmp_path / "new"), row=4)
    assert read_table(str(tmp_path / "new"), "train")["row_index"].to_pylist() == [4, 5, 6, 8, 9, 10]
    assert read_table(str(tmp_path / "new"), "heldout").equals(read_table(str(tmp_path / "v1"), "heldout"))
    assert meta["source_rows"] == [[4, 12]] and meta["derived_from"]["operation"] == "train rows from source row 4"
    assert check(str(tmp_path / "new"))["fingerprint"] == meta["fingerprint"]
    with pytest.raises(CorpusError, match="not one of them"):
        since(str(tmp_path / "v1"), str(tmp_path / "far"), row=99)


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_corpus_matches_its_manifest(shipped):
    meta = check(str(shipped))
    assert meta["target"] == "embedded:smollm2-135m" and meta["source"] == "embedded:sharegpt"
    assert meta["regeneration"]["target"]["dtype"] == "float32"  # the target as served
    assert meta["splits"]["heldout"]["rows"] > 0 and meta["splits"]["train"]["answer_tokens"] > 100_000
    made_by = read_manifest(shipped)["made_by"]
    assert "python -m lilicorr.platform.corpus " in made_by


@pytest.mark.parametrize("base,extension", [(f"sharegpt-v{n}", f"sharegpt-v{n + 1}") for n in (2, 3, 4)])
def test_an_extension_holds_every_row_of_its_base_then_later_source_rows(base, extension):
    meta = read_manifest(CORPORA / extension)
    assert meta["extends"] == f"corpora/smollm2-135m/{base}" and meta["source_rows"] == [[0, meta["source_rows"][0][1]]]
    assert meta["source_rows"][-1][1] > read_manifest(CORPORA / base)["source_rows"][-1][1]
    for split in ("train", "heldout"):
        old, new = read_table(CORPORA / base, split), read_table(CORPORA / extension, split)
        assert new.num_rows > old.num_rows and new.slice(0, old.num_rows).equals(old)


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_corpus_answers_are_the_targets_greedy_continuations(shipped):
    """Serving consistency, the point of the corpus: from a held-out row's prompt the target's own greedy
    decoding (transformers generate, not our engine) reproduces the row's first answer tokens."""
    from lilicorr.platform.assets import eos_token_ids, load_target
    from lilicorr.platform.regenerate.generate import hf_greedy

    cfg = load_config("smollm2-135m")
    model, tok = load_target(cfg.target)
    rows = read_table(shipped, "heldout", limit=32).to_pylist()
    # single-turn rows (the mask is 0s then 1s): their answer follows the prompt exactly as generated
    single = [r for r in rows if r["loss_mask"] == sorted(r["loss_mask"])][:2]
    assert len(single) == 2
    for row in single:
        prompt = row["input_ids"][:row["loss_mask"].index(1)]  # everything before the first answer token
        answer = row["input_ids"][len(prompt):len(prompt) + 12]
        assert hf_greedy(model, tok, prompt, len(answer), eos_token_ids(cfg.target, tok)) == answer, row["id"]
