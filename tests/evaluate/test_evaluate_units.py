"""Evaluation pieces without Ray: hub column mappings on local files, the plan, the tables."""

import json

import pytest

from lilicorr.platform.evaluate.benchmarks import HUB, load_benchmark, map_rows
from lilicorr.platform.evaluate.plan import build_plan
from lilicorr.platform.evaluate.tables import build_tables, format_table5, table5, table12

# One record per hub benchmark in its published schema (only the columns the mapping reads, plus one more).
HUB_RECORDS = {
    "gsm8k": {"question": "Tom has 3 apples...", "answer": "#### 3"},
    "math-500": {"problem": "Find x.", "solution": "...", "answer": "2", "subject": "Algebra", "level": 2,
                 "unique_id": "test/algebra/1.json"},
    "aime-2025": {"question": "Let N be...", "answer": "70"},
    "mbpp": {"task_id": 11, "text": "Write a function to remove a char.", "code": "def f(): pass",
             "test_list": ["assert f('a') == ''", "assert f('b') == ''"]},
    "livecodebench": {"question_id": "abc301_a", "question_title": "T", "question_content": "Read N.",
                      "starter_code": "class Solution:\n    pass", "difficulty": "easy", "platform": "atcoder"},
    "alpacaeval": {"instruction": "Name three colors.", "output": "red", "generator": "gpt4", "dataset": "helpful_base"},
    "speed-bench": {"question_id": "q1", "category": "coding", "sub_category": "x", "turns": ["Write a sort.", "Now in C."],
                    "source": "s", "src_id": "1", "difficulty": "easy", "multiturn": True},
    "speed-bench-1k": {"question_id": "t1", "category": "low_entropy", "sub_category": "", "turns": ["Summarize: ..."],
                       "source": "s", "src_id": "2", "difficulty": "", "multiturn": False},
}
EXPECTED_PROMPT = {
    "gsm8k": "Tom has 3 apples...",
    "math-500": "Find x.",
    "aime-2025": "Let N be...",
    "mbpp": "Write a function to remove a char.\nYour code should pass these tests:\n\nassert f('a') == ''\nassert f('b') == ''",
    "livecodebench": "Read N.\n\nUse this starter code:\n```python\nclass Solution:\n    pass\n```",
    "alpacaeval": "Name three colors.",
    "speed-bench": "Write a sort.",
    "speed-bench-1k": "Summarize: ...",
}


@pytest.mark.parametrize("name", sorted(HUB_RECORDS))
def test_hub_column_mapping_on_a_local_file(name, tmp_path):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(HUB_RECORDS[name]) + "\n" + json.dumps(HUB_RECORDS[name]) + "\n")
    b = load_benchmark(name, num_prompts=1, local_file=str(path))
    assert b.skipped is None and len(b.rows) == 1
    assert b.rows[0]["messages"] == [{"role": "user", "content": EXPECTED_PROMPT[name]}]
    cat = HUB[name].category_col
    assert b.rows[0].get("category") == (HUB_RECORDS[name][cat] if cat else None)


def test_every_hub_benchmark_has_a_mapping_test():
    assert set(HUB) - set(HUB_RECORDS) <= {"speed-bench-2k", "speed-bench-8k", "speed-bench-16k", "speed-bench-32k"}
    assert map_rows("speed-bench-32k", [HUB_RECORDS["speed-bench-1k"]])[0]["id"] == "speed-bench-32k-t1"


def test_offline_hub_benchmark_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    b = load_benchmark("gsm8k", 2)
    assert b.rows == [] and "openai/gsm8k" in b.skipped and "hub" in b.skipped
    assert "unknown benchmark" in load_benchmark("no-such-bench").skipped
    mt = load_benchmark("mt-bench", 3)
    assert len(mt.rows) == 3 and mt.rows[0]["category"] == "writing"


def _export(folder, head, mu=0.0):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"head_kind": head, "config": {"loss": {"mu": mu, "lam": 1.0}}}))


def test_plan_maps_systems_to_exports_and_skips_the_rest(tmp_path):
    _export(tmp_path / "dflash", "none")
    _export(tmp_path / "lilicorr", "lilicorr")
    plan = build_plan(["dflash", "ddtree", "lilicorr-viterbi", "domino", "hf-pld"], ["mt-bench"], [0.0, 1.0],
                      [0, 1, 2], [1, 8], "tiny-random", checkpoint=str(tmp_path))
    assert plan.checkpoints["dflash"] == plan.checkpoints["ddtree"] == str(tmp_path / "dflash")
    assert plan.checkpoints["lilicorr-viterbi"] == str(tmp_path / "lilicorr") and plan.checkpoints["ar"] is None
    assert "no 'domino' export" in plan.skipped["domino"]
    assert "batch size 1" in plan.skipped["hf-pld-c8"]
    from mlflow.utils.validation import _validate_tag_name
    for key in plan.skipped:  # logged as `skipped.<key>` tags: MLflow refuses "@" (the c = 8 grid failed on it)
        _validate_tag_name(f"skipped.{key}")
    keys = {c.key for c in plan.cells}
    assert "ar|mt-bench|T0|s0|c8" in keys and "ar|mt-bench|T0|s1|c1" not in keys  # T = 0 runs one seed
    assert "ddtree|mt-bench|T1|s2|c8" in keys and "hf-pld|mt-bench|T1|s2|c1" in keys
    assert len(plan.cells) == (4 * 2 + 1) * (1 + 3)  # 4 systems x 2 c + hf-pld at c=1, over (T0) + 3 seeds at T1
    single = build_plan(["lilicorr", "lilicorr-margin", "dflash"], ["mt-bench"], [0.0], [0], [1], "tiny-random",
                        checkpoint=str(tmp_path / "lilicorr"))
    assert set(single.checkpoints) == {"ar", "lilicorr"} and "lilicorr-margin" in single.skipped
    rand = build_plan(["domino"], ["mt-bench"], [0.0], [0], [1], "tiny-random", random_drafter=True)
    assert rand.checkpoints == {"ar": None, "domino": None} and not rand.skipped
    with pytest.raises(ValueError, match="unknown system 'nope'"):
        build_plan(["nope"], ["mt-bench"], [0.0], [0], [1], "tiny-random")


def _rec(system, bench, tps, tau=None, temp=0.0, seed=0, c=1, **extra):
    m = {"tokens_per_s": tps, **({"tau": tau} if tau is not None else {}), **extra}
    return {"system": system, "benchmark": bench, "temperature": temp, "seed": seed, "concurrency": c,
            "objective": "gamma=0.25, lam=1.0, mu=0.0", "metrics": m}


def test_tables_by_hand():
    recs = [_rec("ar", "mt-bench", 20.0, speedup=1.0), _rec("lilicorr", "mt-bench", 30.0, 1.75, speedup=1.5),
            _rec("lilicorr-viterbi", "mt-bench", 24.0, 1.6, speedup=1.2),
            _rec("ar", "mt-bench", 10.0, temp=1.0, seed=0, speedup=1.0), _rec("ar", "mt-bench", 30.0, temp=1.0, seed=1, speedup=1.0),
            _rec("lilicorr", "mt-bench", 10.0, 1.2, temp=1.0, seed=0, speedup=1.0),
            _rec("lilicorr", "mt-bench", 20.0, 1.4, temp=1.0, seed=1, speedup=2 / 3)]
    t1, t5 = table5(recs)
    row0 = t5.rows[0]
    assert row0[:2] == ["0", "mt-bench"] and row0[2] == "– / 20.0 / 1.00x" and row0[3] == "1.75 / 30.0 / 1.50x"
    row1 = t5.rows[1]  # T = 1: seed means (AR 20 tok/s; LiLiCorr τ 1.3, 15 tok/s, speedups 1.0 and 0.667 -> 0.83)
    assert row1[3] == "1.30 / 15.0 / 0.75x"
    assert t1.rows[2] == ["1", "mt-bench", "1.00x", "0.83x", ""]
    assert t1.rows[1][:4] == ["0", "Average", "1.00x", "1.50x"]
    t12 = table12(recs)
    assert t12.rows == [["mt-bench", "1.750", "1.600", "-8.57%"]]
    names = [t.name for t in build_tables(recs)]
    assert names == ["table1", "table5", "table11", "table12"]  # no timing, one concurrency: no tables 3, 13
    assert "tau_sd" in t5.csv().splitlines()[0]


def test_demo_table5_text_layout():
    results = {("mt-bench", "ar"): {"tau": 1.0, "tokens_per_s": 20.0},
               ("mt-bench", "dflash"): {"tau": 1.5, "tokens_per_s": 25.0}}
    text = format_table5(results, ["mt-bench"], ["ar", "dflash"])
    row = [line for line in text.splitlines() if line.startswith("mt-bench")][0]
    assert "– / 20.0 / 1.00x" in row and "1.50 / 25.0 / 1.25x" in row
