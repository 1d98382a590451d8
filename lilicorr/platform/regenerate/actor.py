"""The generator: regenerates every assistant turn of a batch of conversations with the target.

`regenerate_rows` is the work itself (plain Python, testable without Ray); `ConversationRegenerator`
is the Ray Data actor around it, loading the target once per actor. Turns are regenerated in order
across the whole batch — turn 1 of every conversation, then turn 2, ... — so each later user message
sees the target's own earlier answers, and each generate call carries one prompt per live
conversation.

Every input row yields exactly one output row: a regenerated conversation, or an empty one whose
`skip_reason` says why it was skipped (the driver counts rows per shard, skipped ones included).

Length grouping: the rows of a call are split into groups of `group_rows` consecutive source rows of one
shard (a pure function of the row index, so a resumed run forms the same groups); within a group each
turn's prompts are sorted by token length (ties by position) and generated `batch_size` at a time, so a
10K-token prompt shares its static-cache batch with other long ones, not with 100-token ones.

Failures: a generate call that raises (a CUDA OOM, an engine error) skips the conversations it held,
with reason `generate_error` and the exception in `skip_detail`; the other batches go on. A generate function
may also fail single prompts by returning a `SkipConversation` in a prompt's place (the vllm backend: one failed
request of a call, or an empty generation); only that prompt's conversation is skipped, counted by its reason. The shard is
still written and recorded (its manifest entry counts the failures), so a rerun does not hit the same
batch forever; `data.retry_failed=true` (say with a smaller data.batch_size) regenerates those shards.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from lilicorr.platform.regenerate.conversations import (GENERATE_ERROR, MALFORMED, PROMPT_TOO_LONG, TEMPLATE_ERROR,
                                                        AssistantTurn, SkipConversation, conversation_skeleton,
                                                        prompt_ids, tokenize_with_loss_mask)

# (prompts, max_new_tokens, stop_ids) -> per prompt its generated ids (stop id included), or a SkipConversation
GenerateFn = Callable[[list[list[int]], int, list[int]], list[Union[list[int], SkipConversation]]]


@dataclass
class RegenSettings:
    max_new_tokens: int  # cap per assistant turn (data.max_new_tokens)
    max_prompt_tokens: int  # longer prompts are not generated from
    stop_ids: list[int]
    enable_thinking: bool = False
    batch_size: int = 0  # prompts per generate call; 0 = all of a group's prompts of one turn in one call
    group_rows: int = 0  # rows sorted by prompt length together (aligned blocks of row_index); 0 = the whole call
    fail_row: Optional[int] = None  # test hook (data.fail_row): a generate call holding this row raises
    max_turns: Optional[int] = None  # assistant turns regenerated per conversation (data.max_turns); None = all


def call_rows(data) -> int:
    """Rows per actor call (Ray Data batch) = one length-sorting group: sort_window generate batches, at most
    a shard (so a call lies inside one shard when rows_per_shard is a multiple of it)."""
    return max(1, min(data.rows_per_shard, data.batch_size * max(1, data.sort_window)))


def output_schema():
    import pyarrow as pa

    return pa.schema([
        ("shard", pa.int32()), ("row_index", pa.int64()), ("id", pa.string()), ("split", pa.string()),
        ("skip_reason", pa.string()), ("skip_detail", pa.string()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("num_assistant_turns", pa.int32()), ("generated_tokens", pa.int32()),
        ("turns_capped", pa.int32()),  # turns cut at max_new_tokens (no end-of-turn token)
        ("turns_dropped", pa.int32()),  # later turns left out because their prompt was too long
        ("generate_seconds", pa.float64()),
    ])


@dataclass
class _Conversation:
    k: int  # position in the input batch
    row: dict[str, Any]
    source: list[dict[str, str]]  # [system?] user assistant user assistant ... (assistant text unused)
    out: list[dict[str, str]]  # regenerated so far
    turns: list[AssistantTurn]
    turns_dropped: int = 0
    seconds: float = 0.0
    failed: Optional[SkipConversation] = None

    def next_assistant(self) -> Optional[int]:
        """Index in `source` of the next assistant message to regenerate."""
        return next((i for i in range(len(self.out), len(self.source)) if self.source[i]["role"] == "assistant"), None)


def regenerate_rows(rows: list[dict[str, Any]], tokenizer, generate: GenerateFn,
                    settings: RegenSettings) -> list[dict[str, Any]]:
    """One output row per input row (raw rows from read.read_shard_rows), in input order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for k, row in enumerate(rows):
        # group_rows=0: one group over the whole call, shards mixed (the vllm backend's wave: one call per turn)
        key = (int(row.get("shard", 0)), int(row.get("row_index", 0)) // settings.group_rows) if settings.group_rows \
            else (0, 0)
        groups.setdefault(key, []).append(k)
    out: list[dict[str, Any]] = [{}] * len(rows)
    for ks in groups.values():
        for k, result in zip(ks, _regenerate_group([rows[k] for k in ks], tokenizer, generate, settings)):
            out[k] = result
    return out


def _regenerate_group(rows: list[dict[str, Any]], tokenizer, generate: GenerateFn,
                      settings: RegenSettings) -> list[dict[str, Any]]:
    from lilicorr.platform.assets import normalize_messages

    results: dict[int, dict[str, Any]] = {}
    live: list[_Conversation] = []
    for k, row in enumerate(rows):
        try:
            if row.get("error"):
                raise SkipConversation(MALFORMED, row["error"])
            try:
                messages = normalize_messages(json.loads(row["turns"]))
            except (ValueError, TypeError) as e:
                raise SkipConversation(MALFORMED, str(e)) from None
            source = conversation_skeleton(messages)
        except SkipConversation as e:
            results[k] = _skipped(row, e)
            continue
        head = 1 if source[0]["role"] == "system" else 0
        live.append(_Conversation(k=k, row=row, source=source, out=source[:head], turns=[]))

    active = list(live)
    while active:
        prompts, asking = [], []
        for conv in active:
            a = conv.next_assistant() if settings.max_turns is None or len(conv.turns) < settings.max_turns else None
            if a is None:
                continue
            prefix = conv.out + conv.source[len(conv.out):a]  # the user message(s) before this answer
            try:
                ids = prompt_ids(tokenizer, prefix, settings.enable_thinking)
            except Exception as e:  # noqa: BLE001 — e.g. a template that refuses a system message
                conv.failed = SkipConversation(TEMPLATE_ERROR, f"{type(e).__name__}: {e}")
                continue
            if len(ids) > settings.max_prompt_tokens:
                conv.turns_dropped = sum(1 for m in conv.source[a:] if m["role"] == "assistant")
                continue
            conv.out = prefix
            prompts.append(ids)
            asking.append(conv)
        if not asking:
            break
        _generate_sorted(prompts, asking, tokenizer, generate, settings)
        active = [conv for conv in asking if conv.failed is None]

    for conv in live:
        k = conv.k
        if conv.failed is not None:
            results[k] = _skipped(conv.row, conv.failed)
            continue
        if not conv.turns:
            results[k] = _skipped(conv.row, SkipConversation(PROMPT_TOO_LONG, "first prompt exceeds max_prompt_tokens"))
            continue
        try:
            input_ids, loss_mask = tokenize_with_loss_mask(tokenizer, conv.out, conv.turns, settings.stop_ids,
                                                           settings.enable_thinking)
        except SkipConversation as e:
            results[k] = _skipped(conv.row, e)
            continue
        results[k] = {
            **_base(conv.row), "skip_reason": "", "skip_detail": "", "messages": conv.out,
            "input_ids": input_ids, "loss_mask": loss_mask, "num_assistant_turns": len(conv.turns),
            "generated_tokens": sum(len(t.generated_ids) for t in conv.turns),
            "turns_capped": sum(1 for t in conv.turns if not t.finished),
            "turns_dropped": conv.turns_dropped, "generate_seconds": conv.seconds,
        }
    return [results[k] for k in range(len(rows))]


def _generate_sorted(prompts: list[list[int]], asking: list[_Conversation], tokenizer, generate: GenerateFn,
                     settings: RegenSettings) -> None:
    """One turn of every asking conversation: prompts sorted by length, batch_size per generate call; a call
    that raises marks its conversations failed and the next call goes on."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    size = settings.batch_size or len(order)
    stops = set(settings.stop_ids)
    for start in range(0, len(order), size):
        idx = order[start:start + size]
        batch = [prompts[i] for i in idx]
        t0 = time.perf_counter()
        try:
            if settings.fail_row is not None and any(int(asking[i].row["row_index"]) == settings.fail_row
                                                     for i in idx):
                raise RuntimeError(f"test hook: data.fail_row={settings.fail_row} is in this batch")
            outputs = generate(batch, settings.max_new_tokens, settings.stop_ids)
            if len(outputs) != len(batch):
                raise RuntimeError(f"generate returned {len(outputs)} outputs for {len(batch)} prompts")
        except Exception as e:  # noqa: BLE001 — an OOM or engine error costs this batch, not the job
            detail = (f"{type(e).__name__} in a generate call of {len(batch)} prompt{'s' * (len(batch) != 1)} "
                      f"(longest {len(batch[-1])} tokens): {e}")
            print(f"[regenerate] actor pid {os.getpid()}: {detail[:500]}", file=sys.stderr, flush=True)
            for i in idx:
                asking[i].failed = SkipConversation(GENERATE_ERROR, detail)
            continue
        seconds = time.perf_counter() - t0
        total = max(1, sum(len(o) for o in outputs if not isinstance(o, SkipConversation)))
        for i, gen in zip(idx, outputs):
            conv = asking[i]
            if isinstance(gen, SkipConversation):  # this prompt alone failed (see the module docstring)
                conv.failed = gen
                continue
            finished = bool(gen) and gen[-1] in stops
            text_ids = gen[:-1] if finished else gen
            content = tokenizer.decode(text_ids, skip_special_tokens=False)
            conv.out = conv.out + [{"role": "assistant", "content": content}]
            conv.turns.append(AssistantTurn(generated_ids=list(gen), finished=finished))
            conv.seconds += seconds * len(gen) / total  # this call's time, shared by tokens


def _base(row: dict[str, Any]) -> dict[str, Any]:
    return {"shard": int(row["shard"]), "row_index": int(row["row_index"]), "id": str(row["id"]),
            "split": str(row["split"])}


def _skipped(row: dict[str, Any], e: SkipConversation) -> dict[str, Any]:
    detail = str(e)
    return {**_base(row), "skip_reason": e.reason, "skip_detail": detail[:300], "messages": [], "input_ids": [],
            "loss_mask": [], "num_assistant_turns": 0, "generated_tokens": 0, "turns_capped": 0,
            "turns_dropped": 0, "generate_seconds": 0.0}


def regen_settings(cfg, model_config, tokenizer) -> RegenSettings:
    """Settings from the config and the target's transformers config and tokenizer (context length, stop ids)."""
    from lilicorr.platform.assets import eos_token_ids

    context = int(getattr(model_config, "max_position_embeddings", 0) or 0) or None
    max_new, max_prompt = cfg.data.max_new_tokens, cfg.data.max_prompt_tokens
    if max_prompt is None and context is None:
        raise ValueError("target has no max_position_embeddings; set data.max_prompt_tokens")
    if context is not None:  # never generate past the model's context
        max_prompt = min(context - max_new, max_prompt if max_prompt is not None else context)
    if max_prompt < 1:
        raise ValueError(f"data.max_new_tokens={max_new} leaves no room for a prompt in a {context}-token context")
    return RegenSettings(max_new_tokens=max_new, max_prompt_tokens=max_prompt,
                         stop_ids=eos_token_ids(cfg.target, tokenizer), enable_thinking=cfg.target.enable_thinking,
                         batch_size=cfg.data.batch_size, group_rows=call_rows(cfg.data), fail_row=cfg.data.fail_row,
                         max_turns=cfg.data.max_turns)


class ConversationRegenerator:
    """Ray Data actor: loads the target once, then regenerates batches (pyarrow Table in and out)."""

    def __init__(self, cfg_dict: dict[str, Any], torch_threads: Optional[int] = None):
        import torch

        from lilicorr.config import Config
        from lilicorr.platform.assets import load_target
        from lilicorr.platform.regenerate.generate import GreedyGenerator

        cfg = Config.from_dict(cfg_dict)
        if torch_threads:
            torch.set_num_threads(torch_threads)
        t0 = time.perf_counter()
        self.model, self.tokenizer = load_target(cfg.target)
        if torch.cuda.is_available():
            self.model.to("cuda")
        self.settings = regen_settings(cfg, self.model.config, self.tokenizer)
        self.generate: GenerateFn = GreedyGenerator(self.model, self.tokenizer, cfg, cfg.data.generate_backend)
        print(f"[regenerate] actor pid {os.getpid()}: target {cfg.target.source} loaded in "
              f"{time.perf_counter() - t0:.1f}s on {next(self.model.parameters()).device}, "
              f"{torch.get_num_threads()} threads, {cfg.data.generate_backend} backend", file=sys.stderr, flush=True)

    def __call__(self, batch):
        import pyarrow as pa

        rows = batch.to_pylist()
        t0 = time.perf_counter()
        out = regenerate_rows(rows, self.tokenizer, self.generate, self.settings)
        seconds = time.perf_counter() - t0
        tokens = sum(r["generated_tokens"] for r in out)
        print(f"[regenerate] actor pid {os.getpid()}: {len(rows)} conversations (rows {rows[0]['row_index']}-"
              f"{rows[-1]['row_index']}), {sum(r['num_assistant_turns'] for r in out)} turns, {tokens} tokens "
              f"in {seconds:.1f}s ({tokens / max(seconds, 1e-9):.1f} tok/s)", file=sys.stderr, flush=True)
        return pa.Table.from_pylist(out, schema=output_schema())
