"""Every GPU figure of issue 15 from one run, as one JSON object (`python jobs/bench.py gpu`).

Random weights of the Qwen3-8B shape in bf16 (no downloads), scaled N(0, 1/fan_in) so greedy output
is not one repeated token. Figures, each against its goal:
  ar_tok_s / ar_limit_tok_s     AR at batch 1 (our forward, CUDA graph, greedy) vs weights bytes / copy bandwidth
  verify16_over_ar_step         a 16-token verification step vs a 1-token step (graphed)
  head_ms_per_block             LiLiCorr head proposal (random head), one block at batch 1
  topk_of_copy_b32              fused top-K + log-softmax at batch 32, fraction of copy bandwidth
  match_walk_us                 lattice match + greedy walk, batch 1
  greedy_agreement_vs_eager     our SDPA path vs transformers-order eager attention, bf16 greedy tokens
  speedup_over_hf_eager / _static   vs transformers generate (eager; static cache + torch.compile)
  engine_ar_tok_s               the full engine (Decoder, its own CUDA graphs) at batch 1
A section that fails records "<name>_error" and the run exits non-zero (no silent fallback); a section
that would pass the time limit is recorded as skipped. `dry_run=True` runs the same code on CPU at tiny
shapes (no graphs: recorded as n/a). Imports nothing from Ray, MLflow or DeepSpeed.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

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


def _log(msg: str) -> None:
    print(f"[bench gpu] {msg}", file=sys.stderr, flush=True)


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _ms(fn, dev, reps: int) -> float:
    fn()
    _sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def build_model(dry_run: bool):
    from lilicorr.config import load_config
    from lilicorr.models.target import build_random_target

    cfg = load_config("tiny-random" if dry_run else "qwen3-8b", TINY if dry_run else QWEN3_8B)
    dev = torch.device("cpu" if dry_run else "cuda")
    with torch.device(dev):
        model = build_random_target(cfg.target)
    g = torch.Generator(dev).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 1.0 if "embed_tokens" in name else p.shape[1] ** -0.5
                p.normal_(0.0, std, generator=g)
    return cfg, model.eval(), dev


class _Run:
    def __init__(self, limit_s: float):
        self.t0, self.limit, self.res, self.failed = time.perf_counter(), limit_s, {}, []

    def left(self) -> float:
        return self.limit - (time.perf_counter() - self.t0)

    def section(self, name: str, need_s: float, fn) -> None:
        if self.left() < need_s:
            self.res[f"{name}_skipped"] = f"time limit: {self.left():.0f} s left, needs ~{need_s:.0f} s"
            _log(self.res[f"{name}_skipped"] + f" ({name})")
            return
        t = time.perf_counter()
        try:
            self.res.update(fn())
        except Exception as e:  # recorded and made loud by the exit status, the other figures still print
            self.res[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            self.failed.append(name)
            _log(f"{name} FAILED: {self.res[f'{name}_error']}")
        _log(f"{name}: {time.perf_counter() - t:.1f} s")


def _greedy(target, cache, prompt, n: int, step=None) -> list[int]:
    """Greedy continuation of `prompt` (1, P) in row 0 of `cache` with our forward (or a graphed step)."""
    cache.lens.zero_()
    logits = target(prompt, cache, slice(0, 1), prompt.shape[1], want_captured=False).logits[:, -1]
    cache.lens[0] = prompt.shape[1]
    tok = logits.argmax(-1, keepdim=True)  # (1, 1)
    out = [tok]
    for _ in range(n - 1):
        if step is not None:
            logits = step(tok)[:, -1]
        else:
            logits = target(tok, cache, slice(0, 1), int(cache.lens[0]) + 1, want_captured=False).logits[:, -1]
        cache.lens[0] += 1
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
    return torch.cat(out, 1)[0].tolist()


def run(dry_run: bool = False, limit_s: float = 540.0, new_tokens: int = 128, prompt_len: int = 512) -> dict:
    from .forward_graphs import ForwardGraphs
    from .measure import copy_bandwidth
    from .target_forward import TargetForward

    if dry_run:
        new_tokens, prompt_len = min(new_tokens, 8), min(prompt_len, 24)
    r = _Run(limit_s)
    cfg, model, dev = build_model(dry_run)
    graphs_ok = dev.type == "cuda"
    reps = 50 if graphs_ok else 3
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    r.res.update({"device": torch.cuda.get_device_name() if graphs_ok else "cpu (dry run)", "dry_run": dry_run,
                  "torch": torch.__version__, "weights_gb": weight_bytes / 1e9, "goals": GOALS})
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
        state["graphs"] = ForwardGraphs(tf, cache, steps=(1, 16), buckets=(1,))
        return {"cuda_graphs": "captured (batch bucket 1; T = 1, 16)"}

    def ar():
        gr = state.get("graphs")
        step = (lambda tok: gr(tok)) if gr is not None else None
        _greedy(tf, cache, prompt, 8, step)  # warm
        _sync(dev)
        t0 = time.perf_counter()
        toks = _greedy(tf, cache, prompt, new_tokens, step)
        _sync(dev)
        state["fast"] = toks
        tps = (new_tokens - 1) / (time.perf_counter() - t0)  # the prefill's token is not a decode step
        out = {"ar_tok_s": tps}
        if graphs_ok:
            out["ar_fraction_of_limit"] = tps / (state["bw"] / weight_bytes)
        return out

    def verify():
        gr = state.get("graphs")
        cache.lens[0] = prompt_len
        out = {}
        for t in (1, 16):
            toks = torch.randint(0, model.config.vocab_size, (1, t), generator=g).to(dev)
            fn = ((lambda toks=toks: gr(toks)) if gr is not None else
                  (lambda toks=toks, t=t: tf(toks, cache, slice(0, 1), prompt_len + t, want_captured=False)))
            out[f"step_{t}_ms"] = _ms(fn, dev, reps)
        out["verify16_over_ar_step"] = out["step_16_ms"] / out["step_1_ms"]
        return out

    def agreement():
        tf.eager_attention = True
        try:
            ref = _greedy(tf, cache, prompt, new_tokens)
        finally:
            tf.eager_attention = False
        fast = state.get("fast") or _greedy(tf, cache, prompt, new_tokens)
        first = next((i for i, (a, b) in enumerate(zip(fast, ref)) if a != b), len(ref))
        return {"greedy_agreement_vs_eager": sum(a == b for a, b in zip(fast, ref)) / len(ref),
                "greedy_tokens_before_divergence": first}

    def head():
        from .systems import get_system, load_draft_model

        drafter, hd, _ = load_draft_model(cfg, model, get_system("lilicorr"))
        s, v, h = drafter.block_size - 1, model.config.vocab_size, model.config.hidden_size
        logits = torch.randn(1, s, v, device=dev).to(model.dtype)
        hidden = torch.randn(1, s, h, device=dev).to(model.dtype)
        tstate = torch.randn(1, drafter.shape.num_captured * h, device=dev).to(model.dtype)
        anchor = torch.zeros(1, dtype=torch.long, device=dev)
        with torch.no_grad():
            ms = _ms(lambda: hd.propose(logits, hidden, tstate, anchor), dev, reps)
        del drafter, hd
        return {"head_ms_per_block": ms, "head_note": "eager (no CUDA graph around the head)"}

    def kernels():
        from lilicorr.kernels import bench as kb

        if not graphs_ok:
            return {"kernels": "n/a on CPU (dry run): Triton kernels need CUDA"}
        bw = state["bw"]
        topk = kb.bench_topk(dev, 32, 200, bw, True, True)
        walk = kb.bench_walk(dev, 1, "greedy", 200, bw, True, True)
        best = lambda res, key: min((row for row in res["rows"] if row["impl"].startswith("triton") and key in row),  # noqa: E731
                                    key=lambda row: row["us"])
        return {"topk_of_copy_b32": best(topk, "of_copy")["of_copy"], "topk_us_b32": best(topk, "us")["us"],
                "match_walk_us": best(walk, "us")["us"]}

    def hf(kind: str):
        def fn():
            from .measure_batch import hf_batch_tps

            n = max(2, new_tokens // 4) if kind == "static" else max(2, new_tokens // 8)
            old = model.config._attn_implementation
            model.config._attn_implementation = "eager"
            try:
                if kind == "static":  # transformers compiles the forward itself for a static cache on CUDA
                    model.generation_config.cache_implementation = "static"
                tps, _, _ = hf_batch_tps(model, [prompt[0].tolist()], n, [], 1)  # warm-up call compiles
            finally:
                model.config._attn_implementation = old
                model.generation_config.cache_implementation = None
            out = {f"hf_{kind}_tok_s": tps}
            if "ar_tok_s" in r.res:
                out[f"speedup_over_hf_{kind}"] = r.res["ar_tok_s"] / tps
            return out
        return fn

    def engine():
        from .measure import engine_tps

        cfg.engine.cuda_graphs = graphs_ok
        tps, _, _ = engine_tps(cfg, model, [prompt[0].tolist()], new_tokens, stop_ids=[])
        return {"engine_ar_tok_s": tps}

    full = not dry_run
    r.section("bandwidth", 5, bandwidth)
    r.section("graphs", 60 if full else 1, graphs)
    r.section("ar", 20 if full else 1, ar)
    r.section("verify", 10 if full else 1, verify)
    r.section("agreement", 60 if full else 1, agreement)
    r.section("kernels", 60 if full else 1, kernels)
    r.section("head", 60 if full else 1, head)
    state.pop("graphs", None)
    r.section("engine", 120 if full else 1, engine)
    r.section("hf_eager", 90 if full else 1, hf("eager"))
    r.section("hf_static", 150 if full else 1, hf("static"))
    r.res["wall_s"] = time.perf_counter() - r.t0
    r.res["failed_sections"] = r.failed
    return r.res


def main(argv=None) -> dict:
    import argparse

    ap = argparse.ArgumentParser(prog="bench.py gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on CPU at tiny shapes")
    ap.add_argument("--time-limit", type=float, default=540.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="", help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("bench.py gpu: no CUDA device (use --dry-run on CPU)")
    res = run(args.dry_run, args.time_limit, args.new_tokens)
    line = json.dumps(res)
    print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    if res["failed_sections"]:
        raise SystemExit(f"bench.py gpu: failed sections: {', '.join(res['failed_sections'])}")
    return res
