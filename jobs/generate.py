"""Generate with one decoding system over a JSONL of prompts; one output row per prompt.

    python jobs/generate.py --preset smollm2-135m --system lilicorr --checkpoint outputs/train/export \\
        --prompts prompts.jsonl --out out.jsonl [--temperature 0 --seed 0 --max-new-tokens 128 \\
        --batch-size 4 --timing --no-warmup] [section.field=value ...]

Input rows: {"id": ..., "messages": [...]} (chat template, generation prompt added) or
{"id": ..., "prompt": "..."} (raw text); or `--prompts NAME [--num-prompts N]` for a packaged benchmark
(lilicorr/platform/benchmark_prompts.py: mt-bench, mt-bench-turn2, alpaca, long-2k ... long-16k, ...). Output rows: {"id", "prompt_ids", "output_ids", "text",
"blocks", "accepted_tokens"} (+ "error" for a row that could not run; the others still run).
Progress on stderr; the last stdout line is one JSON object: tau, tokens_per_s, blocks, system, ...
A warm-up (Decoder.warmup: a few short requests) runs first, so tokens_per_s and wall_s do not hold the first calls' compile time.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`

from lilicorr.cli import parse_job_args  # noqa: E402


def _add_arguments(p) -> None:
    p.add_argument("--system", default=None, help="ar | dflash | lilicorr | lilicorr-viterbi | domino | dspark | dspark-sampled | ddtree "
                   "(default: engine.system)")
    p.add_argument("--checkpoint", default=None, help="exported drafter + head folder (JointModel.export) or models:/NAME@ALIAS "
                   "(default: the shipped checkpoints/<preset>/<export>/ when there is one)")
    p.add_argument("--drafter", default=None, choices=["random"], help="an untrained random drafter + head")
    p.add_argument("--prompts", required=True, help="input JSONL, or a packaged benchmark's name (mt-bench, "
                   "mt-bench-turn2, alpaca, long-4k, ...; benchmark_prompts.PACKAGED_BENCHMARKS)")
    p.add_argument("--num-prompts", type=int, default=None, help="with a benchmark name: its first N prompts")
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None, help="rows decoded together (engine.max_batch_size)")
    p.add_argument("--timing", action="store_true", help="per-block stage timers (Table 3 layout)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up requests (their first-call costs "
                   "then count in tokens_per_s)")


def _fail(msg: str) -> None:
    print(f"generate: error: {msg}", file=sys.stderr)
    sys.exit(2)


def benchmark_prompt_rows(name: str, limit: int | None, tokenizer, enable_thinking: bool,
                          answer) -> list[tuple[object, list[int] | None, str | None]]:
    """[(id, prompt_ids, None)] of a packaged benchmark's first `limit` prompts (mt-bench-turn2's turn-1 answers
    from `answer`, benchmark_prompts.target_answerer)."""
    from lilicorr.platform.benchmark_prompts import (benchmark_prompts, fill_target_turns, needs_target_turns,
                                                     rows_prompt_ids)

    rows = benchmark_prompts(name)
    rows = rows[:limit] if limit else rows
    if needs_target_turns(rows):
        rows = fill_target_turns(rows, answer)
    return [(r["id"], ids, None) for r, ids in zip(rows, rows_prompt_ids(tokenizer, rows, enable_thinking))]


def read_prompt_rows(path: str, tokenizer, enable_thinking: bool) -> list[tuple[object, list[int] | None, str | None]]:
    """[(id, prompt_ids or None, error or None)] for every non-blank line of the JSONL (a row may also be a
    benchmark row of benchmark_prompts.py: a long row is cut to its `fit_tokens`)."""
    from lilicorr.platform.benchmark_prompts import rows_prompt_ids

    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                rows.append((f"line-{n}", None, f"line {n}: not JSON ({e})"))
                continue
            rid = row.get("id", f"line-{n}") if isinstance(row, dict) else f"line-{n}"
            try:
                if not isinstance(row, dict):
                    raise ValueError("row is not a JSON object")
                if "messages" not in row and "prompt" not in row:
                    raise ValueError('row has neither "messages" nor "prompt"')
                ids = rows_prompt_ids(tokenizer, [row], enable_thinking)[0]
                rows.append((rid, ids, None))
            except Exception as e:  # a bad row never stops the others
                rows.append((rid, None, f"line {n}: {e}"))
    return rows


def main(argv: list[str] | None = None) -> dict:
    args, cfg = parse_job_args(__doc__.split("\n")[0], add_arguments=_add_arguments, argv=argv)
    from lilicorr.platform.console import quiet_console
    quiet_console("generate", enabled=argv is None)  # console: stage lines; full log: outputs/logs/
    from lilicorr.engine.systems import UnknownSystemOrCheckpoint, get_system

    try:
        system = get_system(args.system or cfg.engine.system)
    except UnknownSystemOrCheckpoint as e:
        _fail(str(e))
    if system.head_kind is not None and not (args.checkpoint or args.drafter):
        from lilicorr.platform.shipped import shipped_checkpoint

        args.checkpoint = shipped_checkpoint(args.preset, system.name)  # checkpoints/<preset>/<export>/
        if args.checkpoint is None:
            _fail(f"system {system.name!r} needs --checkpoint DIR or --drafter random "
                  f"(no shipped drafter for preset {args.preset!r} under checkpoints/)")
        print(f"[generate] shipped drafter {args.checkpoint}", file=sys.stderr, flush=True)
    if system.head_kind is None and args.checkpoint:
        _fail("system 'ar' takes no --checkpoint")
    if args.checkpoint:  # a folder, or models:/NAME@ALIAS / runs:/ (downloaded once into the cache)
        from lilicorr.platform.tracking import resolve_checkpoint

        try:
            args.checkpoint = resolve_checkpoint(args.checkpoint, uri=cfg.tracking.tracking_uri)[0]
        except FileNotFoundError as err:
            _fail(str(err))
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        _fail(f"checkpoint {args.checkpoint!r} is not a folder")
    from lilicorr.platform.benchmark_prompts import PACKAGED_BENCHMARKS

    if not os.path.exists(args.prompts) and args.prompts not in PACKAGED_BENCHMARKS:
        _fail(f"prompts file {args.prompts!r} not found (nor a packaged benchmark: {', '.join(PACKAGED_BENCHMARKS)})")
    e = cfg.engine
    e.system = system.name
    for field, value in (("temperature", args.temperature), ("seed", args.seed),
                         ("max_new_tokens", args.max_new_tokens), ("max_batch_size", args.batch_size)):
        if value is not None:  # the flag overrides the config's engine.<field>
            setattr(e, field, value)

    from lilicorr.engine.requests import Request
    from lilicorr.engine.systems import build_decoder
    from lilicorr.platform.assets import eos_token_ids, load_target

    t0 = time.time()
    model, tokenizer = load_target(cfg.target)
    print(f"[generate] target {cfg.target.source} loaded in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    stops = eos_token_ids(cfg.target, tokenizer)
    if os.path.exists(args.prompts):
        rows = read_prompt_rows(args.prompts, tokenizer, cfg.target.enable_thinking)
    else:  # a packaged benchmark: the cache is sized to its longest prompt
        from lilicorr.platform.benchmark_prompts import target_answerer

        rows = benchmark_prompt_rows(args.prompts, args.num_prompts, tokenizer, cfg.target.enable_thinking,
                                     target_answerer(cfg, model, tokenizer, stops))
        e.max_seq_len = max(e.max_seq_len, max(len(ids) for _, ids, _ in rows) + e.max_new_tokens + 8)
    from lilicorr.engine.kv_cache import KVCacheTooLarge

    try:
        dec = build_decoder(cfg, model, system.name, checkpoint=args.checkpoint, stop_ids=stops, timing=args.timing)
    except (UnknownSystemOrCheckpoint, KVCacheTooLarge) as err:
        _fail(str(err))
    if not args.no_warmup:  # TorchScript / compile / CUDA graphs pay their first calls here, not in tokens_per_s
        t0 = time.time()
        dec.warmup()
        print(f"[generate] warm-up {time.time() - t0:.1f}s (not counted in tokens_per_s)", file=sys.stderr, flush=True)
    requests = [Request(rid, ids or []) for rid, ids, err in rows if err is None]
    print(f"[generate] {system.name}: {len(requests)} prompts ({len(rows) - len(requests)} unreadable), "
          f"batch {e.max_batch_size}, T={e.temperature}", file=sys.stderr, flush=True)
    results = iter(dec.generate(requests, progress=True))
    errors = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for rid, ids, err in rows:
            if err is not None:
                out = {"id": rid, "prompt_ids": [], "output_ids": [], "text": "", "blocks": 0,
                       "accepted_tokens": 0, "error": err}
            else:
                res = next(results)
                out = res.as_row()
                out["text"] = tokenizer.decode(res.output_ids, skip_special_tokens=True)
            errors += "error" in out
            f.write(json.dumps(out) + "\n")
    s = dec.stats
    summary = {"system": system.name, "tau": s.tau, "tokens_per_s": s.tokens_per_s, "blocks": s.blocks,
               "generated_tokens": s.generated, "accepted_draft_tokens": s.accepted_draft,
               "prompts": len(rows), "errors": errors, "wall_s": s.wall_s, "temperature": e.temperature,
               "batch_size": e.max_batch_size, "slot_acceptance": [a / p if p else 0.0 for a, p in
                                                                  zip(s.slot_accepted, s.slot_proposed)],
               "out": args.out}
    if args.timing:
        summary["stage_ms_per_block"] = dec.timers.summary(s.blocks)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
