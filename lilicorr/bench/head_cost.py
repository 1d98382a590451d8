"""What a spec head costs a block at batch 1, inside the engine and replayed on the same inputs (not a test):

    python jobs/bench.py head [--systems lilicorr,dflash] [--prompts 4 --max-new-tokens 48] [--rounds 150]
        [--set engine.draft_tokens=3] [--threads 2]

Why: inside the engine the LiLiCorr head's proposal costs 2-3x what it costs called back to back, because the
target's verification that precedes it streams every target weight (540 MB in fp32 for SmolLM2-135M) through the
caches, and the head then finds its weights, its buffers, its code and the framework's objects in DRAM. This bench
separates the two: each system's decoder runs the prompts with its stage timers on (the in-engine cost, as
`jobs/bench.py stages` reports it) while an observer of its DraftRunner keeps the inputs of every proposal; then those inputs are replayed
(a) back to back ("warm") and (b) each right after one target pass over a verification's tokens at the prompts'
cache length ("after a target pass"), interleaved, so drift slows both alike. Also reported: the pass itself and,
for the same head, (c) after the pass with the head's parameters read first ("prefetched"), which tells whether its
weights are what the cold call waits for. Medians in ms. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lilicorr.bench.harness import bench_prompts, json_line, load_bench_target, logger

_log = logger("head")


def _median_ms(samples: list[float]) -> float:
    return round(1e3 * statistics.median(samples), 3)


class _Recorder:
    """A DraftRunner observer: keeps (the arguments, the head states read) of every proposal and its tokens, and puts
    a call's states back for a replay (the runner's `propose` then computes the same proposal again)."""

    def __init__(self, drafting):
        self.drafting, self.calls, self.tokens = drafting, [], []

    def __call__(self, seen) -> None:
        d, rows = self.drafting, seen.rows
        # propose leaves the states unchanged: as they are now, they are what the head read
        states = (d.target_state[rows].clone(), None if d.context_state is None else d.context_state[rows].clone())
        args = (rows, seen.slot_logits.clone(), seen.slot_hidden.clone(), seen.anchor.clone(), list(seen.temps),
                seen.generator)
        self.calls.append((args, states))
        self.tokens.append(seen.proposal.tokens.clone())

    def restore(self, i: int):
        """Puts call i's head states back and returns its arguments (outside any timed region)."""
        args, (target_state, context_state) = self.calls[i % len(self.calls)]
        d, rows = self.drafting, args[0]
        d.target_state[rows] = target_state
        if context_state is not None:
            d.context_state[rows] = context_state
        return args


def _target_pass(dec, tokens: int, length: int) -> None:
    """One target pass over `tokens` new tokens of row 0 at cache length `length` (what a verification streams).
    Writes K/V past the row's length only, as a verification does before its commit."""
    runner = dec.runner
    with runner.cache.length_for(0, length):
        ids = torch.zeros(1, tokens, dtype=torch.long)
        runner.target(ids, runner.cache, slice(0, 1), kv_len=length + tokens)


def measure(dec, system: str, prompts, max_new: int, rounds: int) -> dict:
    from lilicorr.engine.requests import Request

    drafting = dec.runner.drafting
    recorder = _Recorder(drafting)
    drafting.observers.append(recorder)
    dec.timers.totals_ms.clear()
    blocks = 0
    try:
        for i, p in enumerate(prompts):
            blocks += dec.generate([Request(i, p, max_new_tokens=max_new)])[0].blocks
    finally:
        drafting.observers.remove(recorder)  # the replays below are not recorded
    in_engine = dec.timers.summary(blocks)
    length = int(statistics.median(len(p) for p in prompts)) + max_new // 2
    nodes = dec.runner.block  # the verification's tokens
    params = list(drafting.head.parameters())
    # a replay computes what the engine computed: the same proposal from the same inputs
    same = sum(torch.equal(drafting.propose(*recorder.restore(i)).tokens, recorder.tokens[i])
               for i in range(len(recorder.calls)))
    warm, cold, prefetched, passes = [], [], [], []
    for i in range(rounds):
        args = recorder.restore(i)
        drafting.propose(*args)  # the same call just before: everything it reads is in cache
        t0 = time.perf_counter()
        drafting.propose(*args)
        warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _target_pass(dec, nodes, length)
        passes.append(time.perf_counter() - t0)
        recorder.restore(i)
        t0 = time.perf_counter()
        drafting.propose(*args)
        cold.append(time.perf_counter() - t0)
        _target_pass(dec, nodes, length)
        recorder.restore(i)
        for p in params:
            p.sum()  # outside the timed region: only whether the weights were what the call waited for
        t0 = time.perf_counter()
        drafting.propose(*args)
        prefetched.append(time.perf_counter() - t0)
    return {"system": system, "proposals": len(recorder.calls), "replays_equal": same, "blocks": blocks,
            "in_engine_ms": round(in_engine.get("spec_head_ms", float("nan")), 3),
            "warm_ms": _median_ms(warm), "after_target_pass_ms": _median_ms(cold),
            "after_pass_params_prefetched_ms": _median_ms(prefetched), "target_pass_ms": _median_ms(passes),
            "verify_tokens": nodes, "cache_length": length,
            "head_param_mb": round(sum(p.numel() * p.element_size() for p in params) / 2**20, 2)}


def main(argv: list[str] | None = None) -> dict:
    from lilicorr.bench.stages import warm_decoder
    from lilicorr.platform.shipped import shipped_checkpoint

    ap = argparse.ArgumentParser(prog="bench.py head", description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default="lilicorr,dflash", help="speculative systems, shipped SmolLM2 exports")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=150, help="replays per condition")
    ap.add_argument("--set", action="append", default=["engine.draft_tokens=3"], metavar="KEY=VALUE",
                    help="config overrides for every decoder (default: engine.draft_tokens=3)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.prompts < 1:
        ap.error("--rounds and --prompts must be >= 1")
    cfg, model, tok, stops = load_bench_target("smollm2-135m", args.set, args.threads)
    prompts = bench_prompts(tok, args.prompts, model.config.vocab_size)
    rows = []
    for system in [s for s in args.systems.split(",") if s]:
        ckpt = shipped_checkpoint("smollm2-135m", system)
        if ckpt is None:
            raise SystemExit(f"bench head: no shipped smollm2-135m export for system {system!r}")
        dec = warm_decoder(cfg, model, system, ckpt, stops, prompts, args.max_new_tokens)
        with torch.no_grad():
            row = measure(dec, system, prompts, args.max_new_tokens, args.rounds)
        rows.append(row)
        _log(f"{system:9s} spec head: in the engine {row['in_engine_ms']:.3f} ms, after a target pass "
             f"{row['after_target_pass_ms']:.3f} (params prefetched {row['after_pass_params_prefetched_ms']:.3f}), "
             f"warm {row['warm_ms']:.3f}; the pass {row['target_pass_ms']:.2f} ms over {row['verify_tokens']} tokens "
             f"at length {row['cache_length']}")
    return json_line({"bench": "head", "overrides": args.set, "threads": args.threads, "rows": rows})
