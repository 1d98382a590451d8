"""`python jobs/bench.py gpu [--dry-run] [--out FILE] [--train-layers N]`: every GPU figure from one run, as one JSON
object (written to --out after every section, printed to stdout at the end).

Random weights of the Qwen3-8B shape in bf16 (no downloads), built on the device in bf16 (no CPU copy,
no fp32 pass) and scaled N(0, 1/fan_in) so greedy output is not one repeated token. Figures:
  ar_tok_s / ar_limit_tok_s     AR at batch 1 (our forward, CUDA graph, greedy), clock started after the
                                prefill, vs weights bytes / copy bandwidth
  verify16_over_ar_step         a 16-token verification step vs a 1-token step (graphed)
  greedy_agreement_vs_eager     per-position argmax, teacher-forced on one shared sequence: our graphed
  greedy_agreement_vs_hf        SDPA steps vs our transformers-order eager attention / transformers' forward
  topk_of_copy_b32              fused top-K + log-softmax at batch 32, fraction of copy bandwidth
  match_walk_us                 lattice match + greedy walk, batch 1
  head_ms_per_block             LiLiCorr head proposal (random head, built on the device), one block
  engine_ar_tok_s               the full engine (Decoder, its own CUDA graphs) at batch 1 after the prefill;
                                engine_cuda_graph_captured says whether its graph really ran
  hf_eager_tok_s / hf_static_tok_s and speedup_over_hf_*   transformers generate (bench/hf_peer.py)
Sections run in that order, the static-cache peer last (its first call compiles for about a minute); the Serve
loader's device placement (gpu_serve_load.py) and one joint training step per head (gpu_train.py) run before it.
The run's bookkeeping (time limit, failures, the file rewritten after every section) is sections.py's.
`--dry-run` runs the same code on CPU at tiny shapes (no graphs: recorded as n/a). Imports nothing from Ray,
MLflow or DeepSpeed: the GPU machine has none of them.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from contextlib import contextmanager
from typing import Optional

import torch

from lilicorr.bench.harness import median_s, sync
from lilicorr.bench.sections import Context, Run, Section

QWEN3_8B = ["target.source=random", "target.arch=qwen3", "target.dtype=bfloat16", "target.num_layers=36",
            "target.hidden_size=4096", "target.num_heads=32", "target.num_kv_heads=8", "target.head_dim=128",
            "target.intermediate_size=12288", "target.vocab_size=151936", "target.rope_theta=1000000",
            "target.tie_word_embeddings=false", "target.max_position_embeddings=40960"]
TINY = ["target.source=random", "target.arch=qwen3", "target.dtype=bfloat16", "target.num_layers=4",
        "target.hidden_size=64", "target.num_heads=4", "target.num_kv_heads=2", "target.head_dim=16",
        "target.intermediate_size=128", "target.vocab_size=512", "target.tie_word_embeddings=false",
        "drafter.num_layers=1"]
GOALS = {"ar_fraction_of_limit": 0.8, "verify16_over_ar_step": 1.1, "head_ms_per_block": 0.15,
         "topk_of_copy_b32": 0.6, "match_walk_us": 20.0}
HF_EAGER_TOKENS = 32  # the eager peer is launch-bound: 32 tokens say as much as 128, in a quarter of the time


@contextmanager
def on_device(dev, dtype: torch.dtype):
    """Modules built inside are created on `dev` in `dtype`: an 8B model never exists on the CPU or in fp32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            yield
    finally:
        torch.set_default_dtype(old)


def build_target(target_cfg, dev):
    """A random target of `target_cfg`'s shape, built on `dev` in its dtype, weights ~ N(0, 1/fan_in)."""
    from lilicorr.models.target import build_random_target, torch_dtype

    with on_device(dev, torch_dtype(target_cfg.dtype)):
        model = build_random_target(target_cfg)  # its closing .to(dtype) is a no-op now
    g = torch.Generator(dev).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 1.0 if "embed_tokens" in name else p.shape[1] ** -0.5
                p.normal_(0.0, std, generator=g)
    return model.eval().requires_grad_(False)


def _decode(tf, cache, prompt, n: int, step=None, feed: Optional[torch.Tensor] = None):
    """n greedy steps after `prompt` (1, P) in row 0 of `cache` with our forward (or a graphed `step`).

    feed (1, n - 1): teacher-forced inputs instead of the argmax. Returns (the argmax at each of the n
    positions, seconds from the end of the prefill to the last token: the prefill is not decoding)."""
    dev = prompt.device
    cache.set_length(0, 0)
    logits = tf(prompt, cache, slice(0, 1), prompt.shape[1], want_captured=False).logits[:, -1]
    cache.set_length(0, prompt.shape[1])
    tok = logits.argmax(-1, keepdim=True)  # (1, 1)
    out = [tok]
    sync(dev)
    t0 = time.perf_counter()
    for i in range(n - 1):
        x = tok if feed is None else feed[:, i:i + 1]
        if step is not None:
            logits = step(x)[:, -1]
        else:
            logits = tf(x, cache, slice(0, 1), int(cache.lens[0]) + 1, want_captured=False).logits[:, -1]
        cache.set_length(0, prompt.shape[1] + i + 1)  # the step's token committed
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
    toks = torch.cat(out, 1)[0].tolist()  # one copy to the host, at the end
    return toks, time.perf_counter() - t0


def _engine_decode(dec, prompt: list[int], n: int) -> tuple[list[int], float]:
    """(tokens, seconds after the prefill) of one greedy request on an idle Decoder.

    Decoder.step() runs admission, prefill and the first block in one call, so the prefill is run here
    by the scheduler's own two phases first (same calls, same order), then the clock starts."""
    from lilicorr.engine.requests import Request

    dec.add_request(Request("timed", prompt, max_new_tokens=n, temperature=0.0, stop_ids=[]))
    dec._admit()
    dec._prefill_step()
    sync(dec.runner.device)
    t0 = time.perf_counter()
    done = []
    while dec.has_work():
        done += dec.step()
    sync(dec.runner.device)
    s, res = time.perf_counter() - t0, done[0]
    if res.error or len(res.output_ids) < 2:  # a refused request would time nothing
        raise RuntimeError(res.error or f"the engine returned {len(res.output_ids)} tokens")
    return list(res.output_ids), s


def engine_graph_state(dec, caught: list) -> tuple[Optional[bool], str]:
    """Whether the engine's verify graph really captured: cuda_graphs._Graph falls back to eager with a
    warning, and the scheduler retries a failed block eagerly; either would time the eager engine."""
    graphs = dec.runner.graphs
    if graphs is None:
        return None, "not requested (CPU or engine.cuda_graphs=false)"
    verify = graphs._verify
    if verify.failed or verify.graph is None:
        msgs = [str(w.message) for w in caught if "CUDA graph" in str(w.message)]
        return False, "fell back to eager: " + (msgs[0][:300] if msgs else "no graph after the warm-up")
    return True, "captured (verify pass, every slot, whole-capacity attention)"


def run(dry_run: bool = False, limit_s: float = 420.0, new_tokens: int = 128, prompt_len: int = 512,
        out: str = "", extra: tuple[Section, ...] = ()) -> dict:
    from lilicorr.bench.measure import copy_bandwidth
    from lilicorr.config import load_config
    from lilicorr.engine.cuda_graphs import graphed_target_step
    from lilicorr.engine.target_forward import TargetForward

    if dry_run:
        new_tokens, prompt_len = min(new_tokens, 8), min(prompt_len, 24)
    r = Run(limit_s, out, dry_run)
    cfg = load_config("tiny-random" if dry_run else "qwen3-8b", TINY if dry_run else QWEN3_8B)
    dev = torch.device("cpu" if dry_run else "cuda")
    model = build_target(cfg.target, dev)
    graphs_ok = dev.type == "cuda"
    reps = 50 if graphs_ok else 3
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    r.res.update({"device": torch.cuda.get_device_name() if graphs_ok else "cpu (dry run)", "dry_run": dry_run,
                  "torch": torch.__version__, "weights_gb": weight_bytes / 1e9, "goals": GOALS,
                  "target_dtype": str(model.dtype), "target_device": str(next(model.parameters()).device),
                  "new_tokens": new_tokens, "prompt_len": prompt_len,
                  "build_s": round(time.perf_counter() - r.t0, 2)})
    r.write()
    tf = TargetForward(model)
    tf.eager_attention = False  # the fast path; the eager order is the agreement reference below
    cache = tf.new_cache(1, prompt_len + new_tokens + 32)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=g).to(dev)
    state: dict = {}

    def bandwidth():
        bw = copy_bandwidth() if graphs_ok else float("nan")
        state["bw"] = bw
        return {"copy_bandwidth_tb_s": bw / 1e12, "ar_limit_tok_s": bw / weight_bytes}

    def graphs():
        if not graphs_ok:
            return {"cuda_graphs": "n/a on CPU (dry run): steps run eagerly"}
        # the engine's graph wrapper (cuda_graphs.py), one graph per step length, row 0, whole-capacity attention
        state["graphs"] = {t: graphed_target_step(tf, cache, t) for t in (1, 16)}
        return {"cuda_graphs": "captured (engine/cuda_graphs.py; one row; T = 1, 16)"}

    def step_fn():  # the graphed 1-token step; None: our forward, eagerly
        return (state.get("graphs") or {}).get(1)

    def ar():
        _decode(tf, cache, prompt, 8, step_fn())  # warm
        toks, decode_s = _decode(tf, cache, prompt, new_tokens, step_fn())
        state["fast"] = toks
        tps = (new_tokens - 1) / decode_s  # tokens after the prefill's one, over the time after the prefill
        res = {"ar_tok_s": tps}
        if graphs_ok:
            res["ar_fraction_of_limit"] = tps / (state["bw"] / weight_bytes)
        return res

    def verify():
        gr = state.get("graphs")
        cache.set_length(0, prompt_len)
        res = {}
        for t in (1, 16):
            toks = torch.randint(0, model.config.vocab_size, (1, t), generator=g).to(dev)
            fn = ((lambda toks=toks, t=t: gr[t](toks)) if gr is not None else
                  (lambda toks=toks, t=t: tf(toks, cache, slice(0, 1), prompt_len + t, want_captured=False)))
            res[f"step_{t}_ms"] = 1e3 * median_s(fn, reps, dev)
        res["verify16_over_ar_step"] = res["step_16_ms"] / res["step_1_ms"]
        return res

    def agreement():
        # One shared sequence (prompt + the fast path's greedy continuation) fed to every path; each
        # position's argmax compared. Free-running outputs diverge for good at the first near-tie.
        cont = state.get("fast") or torch.randint(0, model.config.vocab_size, (new_tokens,), generator=g).tolist()
        feed = torch.tensor([cont[:-1]], device=dev)  # (1, n - 1): inputs after the prefill's token
        fast, _ = _decode(tf, cache, prompt, new_tokens, step_fn(), feed)
        tf.eager_attention = True
        try:
            ref, _ = _decode(tf, cache, prompt, new_tokens, None, feed)
        finally:
            tf.eager_attention = False
        with torch.inference_mode():  # transformers' own forward over the same sequence, one pass
            seq = torch.cat([prompt, feed], 1)
            hf = model(seq).logits[0, prompt_len - 1:].argmax(-1).tolist()
        res = {"agreement_positions": len(fast), "agreement_hf_attn": model.config._attn_implementation}
        for key, other in (("eager", ref), ("hf", hf)):
            same = [a == b for a, b in zip(fast, other)]
            res[f"greedy_agreement_vs_{key}"] = sum(same) / len(same)
            res[f"first_disagreement_vs_{key}"] = same.index(False) if False in same else None
        return res

    def head():
        from lilicorr.engine.systems import get_system, load_draft_model

        with on_device(dev, model.dtype):  # drafter + head created on the device in the target's dtype
            drafter, hd, _ = load_draft_model(cfg, model, get_system("lilicorr"))
        s, v, h = drafter.block_size - 1, model.config.vocab_size, model.config.hidden_size
        logits = torch.randn(1, s, v, device=dev, dtype=model.dtype)
        hidden = torch.randn(1, s, h, device=dev, dtype=model.dtype)
        tstate = torch.randn(1, drafter.shape.num_captured * h, device=dev, dtype=model.dtype)
        anchor = torch.zeros(1, dtype=torch.long, device=dev)
        where = {str(p.device) for p in [*drafter.parameters(), *hd.parameters()]}
        kinds = {str(p.dtype) for p in [*drafter.parameters(), *hd.parameters()]}
        with torch.no_grad():
            ms = 1e3 * median_s(lambda: hd.propose(logits, hidden, tstate, anchor), reps, dev)
        del drafter, hd
        return {"head_ms_per_block": ms, "head_note": "eager (no CUDA graph around the head)",
                "drafter_devices": sorted(where), "drafter_dtypes": sorted(kinds)}

    def kernels():
        from lilicorr.bench import kernels as kb

        if not graphs_ok:
            return {"kernels": "n/a on CPU (dry run): Triton kernels need CUDA"}
        bw = state["bw"]
        topk = kb.bench_topk(dev, 32, 200, bw, True, True)
        walk = kb.bench_walk(dev, 1, "greedy", 200, bw, True, True)
        notes = [f"{row['impl']}: {row['note']}" for res in (topk, walk) for row in res["rows"] if "note" in row]

        def best(res, key):
            rows = [row for row in res["rows"] if row["impl"].startswith("triton") and key in row]
            if not rows:
                raise RuntimeError(f"no Triton row timed ({'; '.join(notes)[:250]})")
            return min(rows, key=lambda row: row["us"])

        return {"topk_of_copy_b32": best(topk, "of_copy")["of_copy"], "topk_us_b32": best(topk, "us")["us"],
                "match_walk_us": best(walk, "us")["us"], "kernel_rows": topk["rows"] + walk["rows"]}

    def engine():
        from lilicorr.engine.systems import build_decoder

        cfg.engine.cuda_graphs = graphs_ok
        cfg.engine.max_new_tokens = new_tokens
        cfg.engine.max_seq_len = prompt_len + new_tokens + 8
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dec = build_decoder(cfg, model, "ar", stop_ids=[], max_batch=1)
            _engine_decode(dec, prompt[0].tolist(), new_tokens)  # warm-up: the same request (graphs, compiles)
            toks, decode_s = _engine_decode(dec, prompt[0].tolist(), new_tokens)
        captured, note = engine_graph_state(dec, caught)
        # the scheduler's fallback: a failed block retried row by row, eagerly (counted over both requests)
        eager_retries = dec.stats.eager_retries
        res = {"engine_ar_tok_s": (len(toks) - 1) / decode_s, "engine_cuda_graph_captured": captured,
               "engine_cuda_graph": note, "engine_eager_retry_blocks": eager_retries,
               "engine_same_tokens_as_ar": toks == state.get("fast", toks)}
        if captured is False or eager_retries:
            r.fail("engine_cuda_graph", f"{note}; eager retries: {eager_retries}")
        return res

    def hf(kind: str, n: int):
        from lilicorr.bench.hf_peer import hf_decode_tps

        got = hf_decode_tps(model, prompt[0].tolist(), n, static=kind == "static")
        res = {f"hf_{kind}_tok_s": got.pop("tok_s"), **{f"hf_{kind}_{k}": v for k, v in got.items()}}
        for ours in ("ar_tok_s", "engine_ar_tok_s"):
            if ours in r.res:
                res[f"speedup_over_hf_{kind}" + ("" if ours == "ar_tok_s" else "_engine")] = (
                    r.res[ours] / res[f"hf_{kind}_tok_s"])
        return res

    r.section("bandwidth", 5, bandwidth)
    r.section("graphs", 60, graphs)
    r.section("ar", 20, ar)
    r.section("verify", 10, verify)
    r.section("agreement", 30, agreement)
    r.section("kernels", 60, kernels)
    r.section("head", 30, head)
    state.pop("graphs", None)
    del cache
    r.section("engine", 60, engine)
    r.section("hf_eager", 40, lambda: hf("eager", new_tokens if dry_run else min(new_tokens, HF_EAGER_TOKENS)))
    ctx = Context(dry_run, dev, r.res, r.fail)
    for sec in extra:
        r.section(sec.name, sec.need_s, lambda sec=sec: sec.fn(ctx))
    ctx.state.clear()
    if graphs_ok:
        torch.cuda.empty_cache()
    r.section("hf_static", 150, lambda: hf("static", new_tokens))
    r.write()
    return r.res


def main(argv=None) -> dict:
    from lilicorr.bench import gpu_serve_load, gpu_train

    ap = argparse.ArgumentParser(prog="bench.py gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on CPU at tiny shapes")
    ap.add_argument("--time-limit", type=float, default=420.0,
                    help="seconds for the whole run (default 7 min); a section that would pass it is skipped")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--train-layers", type=int, default=0,
                    help="target layers of the training steps (0: the shape's own, 36 for Qwen3-8B)")
    ap.add_argument("--no-train", action="store_true", help="skip the training steps")
    ap.add_argument("--out", default="", help="the JSON object, rewritten after every section")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("bench.py gpu: no CUDA device (use --dry-run on CPU)")
    sections = gpu_serve_load.sections() + (() if args.no_train else gpu_train.sections(args.train_layers))
    res = run(args.dry_run, args.time_limit, args.new_tokens, out=args.out, extra=sections)
    print(json.dumps(res), flush=True)
    if res["failed_sections"]:
        raise SystemExit(f"bench.py gpu: failed sections: {', '.join(res['failed_sections'])}")
    return res
