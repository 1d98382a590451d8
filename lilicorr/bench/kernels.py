"""Kernel benchmark (not a test): `python jobs/bench.py kernels [--device cuda] [--batches 1,32]`.

At the paper's Table 4 sizes (B = 16 -> S = 15 drafted slots, K = 8, d_e = 1024, Qwen3 vocabulary
151936, bf16) it times, per call:
  - top-K + log-softmax over (15 x batch) rows of logits,
  - lattice match + walk (greedy and Viterbi) for `batch` sequences, one block each,
for three implementations: the Triton kernel (GPU only), the eager torch reference, and
torch.compile of the reference. It reports achieved bandwidth against the device's measured copy
bandwidth (a large tensor copy, read + write bytes / time) and the goals:
top-K >= 60% of copy bandwidth at batch 32; match + walk <= 20 us per call (one draft step).

GPU timing uses CUDA events; the Triton rows are timed with and without a CUDA graph around the calls
(serving replays the draft step as a graph, so launch overhead is not what it pays). Only Triton rows
are captured: a capture that fails (an eager reference that syncs, say) leaves the CUDA context unfit
for every later capture, so after one failure no further capture is tried and the rows say why. Inputs
rotate over enough buffers to defeat the L2 cache. On CPU the script runs the references and
torch.compile only.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from typing import Callable

import torch

from lilicorr.bench.harness import sync
from lilicorr.kernels.lattice import decode_reference, lattice_scores_reference
from lilicorr.kernels.topk_logsoftmax import topk_logsoftmax_reference

VOCAB, SLOTS, TOP_K, EMBED_DIM, SIGMA = 151936, 15, 8, 1024, 8.0  # Table 4 (Qwen3 vocabulary)
ROTATE_BYTES = 256 * 2**20  # rotate inputs over at least this much memory: larger than any L2
TOPK_BW_GOAL, WALK_US_GOAL = 0.60, 20.0
LAST_CPU_US = [float("nan")]  # CPU runs: process CPU time of the last measurement (all threads)
CAPTURE_FAILED: list[str] = []  # the first failed CUDA-graph capture of this process: later ones are not tried


# ---------------------------------------------------------------- timing
def time_calls(calls: list[Callable[[], object]], device: torch.device, iters: int, graph: bool = False) -> float:
    """Microseconds per call (GPU: mean over CUDA events; CPU: median); `calls` are the same
    operation on rotating input buffers."""
    def each():
        for fn in calls:
            fn()

    each()  # warm-up: compile, autotune, allocate
    sync(device)
    if device.type != "cuda":  # median of single calls: robust to other work on a shared CPU
        times, cpu = [], []
        for n in range(max(1, iters)):
            t0, c0 = time.perf_counter(), time.process_time()
            calls[n % len(calls)]()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        LAST_CPU_US[0] = statistics.median(cpu) * 1e6
        return statistics.median(times) * 1e6
    run = each
    if graph:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            each()
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            each()
        run = g.replay
    run()
    sync(device)
    rounds = max(1, math.ceil(iters / len(calls)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rounds):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (rounds * len(calls))


def copy_bandwidth(device: torch.device, iters: int) -> float:
    """Bytes per second of a large device-to-device copy, counting the read and the write."""
    n = (1 << 30 if device.type == "cuda" else 1 << 28) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    us = time_calls([lambda: dst.copy_(src)], device, iters)
    return 2 * src.numel() * 4 / (us * 1e-6)


# ---------------------------------------------------------------- implementations
def _topk_impls(device: torch.device, skip_compile: bool) -> dict[str, Callable | str]:
    impls: dict[str, Callable | str] = {}
    if device.type == "cuda":
        from lilicorr.kernels.topk_logsoftmax_triton import topk_logsoftmax_triton

        impls["triton"] = lambda x: topk_logsoftmax_triton(x, TOP_K)
    else:
        impls["triton"] = "n/a on CPU"
    impls["eager reference"] = lambda x: topk_logsoftmax_reference(x, TOP_K)
    impls["torch.compile(reference)"] = ("skipped" if skip_compile else
                                         torch.compile(lambda x: topk_logsoftmax_reference(x, TOP_K), dynamic=False))
    return impls


def _walk_reference(rule: str):
    def run(o, i, a):
        anchor, pair = lattice_scores_reference(o, i, a, SIGMA)
        return decode_reference(anchor, pair, rule)

    return run


def _walk_impls(device: torch.device, rule: str, skip_compile: bool) -> dict[str, Callable | str]:
    impls: dict[str, Callable | str] = {}
    if device.type == "cuda":
        from lilicorr.kernels.lattice_triton import match_and_walk_triton

        impls["triton"] = lambda o, i, a: match_and_walk_triton(o, i, a, SIGMA, rule)[0]  # auto: split below 16
        impls["triton fused"] = lambda o, i, a: match_and_walk_triton(o, i, a, SIGMA, rule, split=False)[0]
        impls["triton split"] = lambda o, i, a: match_and_walk_triton(o, i, a, SIGMA, rule, split=True)[0]
    else:
        impls["triton"] = "n/a on CPU"
    impls["eager reference"] = _walk_reference(rule)
    impls["torch.compile(reference)"] = ("skipped" if skip_compile else
                                         torch.compile(_walk_reference(rule), dynamic=False))
    return impls


# ---------------------------------------------------------------- benchmarks
def _n_buffers(nbytes: int, device: torch.device) -> int:
    return 1 if device.type != "cuda" else max(1, min(64, math.ceil(ROTATE_BYTES / nbytes)))


def _measure(name, impl, calls_for, device, iters, nbytes, copy_bw, graphs) -> list[dict]:
    if isinstance(impl, str):
        return [{"impl": name, "note": impl}]
    rows = []
    modes = [False, True] if (graphs and device.type == "cuda" and name.startswith("triton")) else [False]
    for graph in modes:
        label = name + (" [CUDA graph]" if graph else "")
        if graph and CAPTURE_FAILED:
            rows.append({"impl": label, "note": f"not captured: an earlier capture failed ({CAPTURE_FAILED[0]})"})
            continue
        try:
            us = time_calls(calls_for(impl), device, iters, graph=graph)
        except Exception as e:  # a failed compile or capture is a result to report, not a crash
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            if graph:
                CAPTURE_FAILED.append(f"{label}: {why}")
            rows.append({"impl": label, "note": f"failed: {why}"})
            continue
        bw = nbytes / (us * 1e-6)
        row = {"impl": label, "us": us, "GBps": bw / 1e9, "of_copy": bw / copy_bw}
        if device.type != "cuda":
            row["cpu_us"] = LAST_CPU_US[0]
        rows.append(row)
    return rows


def bench_topk(device, batch, iters, copy_bw, skip_compile, graphs) -> dict:
    n = SLOTS * batch
    nbytes = n * VOCAB * 2  # bf16 logits read once; the outputs are negligible
    bufs = [torch.randn(n, VOCAB, device=device).to(torch.bfloat16) for _ in range(_n_buffers(nbytes, device))]
    rows = []
    for name, impl in _topk_impls(device, skip_compile).items():
        calls_for = lambda f: [lambda x=x: f(x) for x in bufs]  # noqa: E731
        rows += _measure(name, impl, calls_for, device, iters, nbytes, copy_bw, graphs)
    return {"what": f"top-K + log-softmax, {n} x {VOCAB} bf16 logits (batch {batch}), K={TOP_K}", "rows": rows,
            "batch": batch, "kind": "topk"}


def bench_walk(device, batch, rule, iters, copy_bw, skip_compile, graphs) -> dict:
    shape = (batch, SLOTS, TOP_K, EMBED_DIM)
    nbytes = 2 * (2 * math.prod(shape) + batch * EMBED_DIM)  # bf16 out + in + anchor vectors
    bufs = [tuple(torch.randn(s, device=device).to(torch.bfloat16) for s in (shape, shape, (batch, EMBED_DIM)))
            for _ in range(_n_buffers(nbytes, device))]
    rows = []
    for name, impl in _walk_impls(device, rule, skip_compile).items():
        calls_for = lambda f: [lambda b=b: f(*b) for b in bufs]  # noqa: E731
        rows += _measure(name, impl, calls_for, device, iters, nbytes, copy_bw, graphs)
    return {"what": f"match + {rule} walk, C={batch} x S={SLOTS} x K={TOP_K} x d={EMBED_DIM} bf16", "rows": rows,
            "batch": batch, "kind": f"walk-{rule}"}


def _print_result(res: dict) -> None:
    print(res["what"])
    for r in res["rows"]:
        if "note" in r:
            print(f"  {r['impl']:<38} {r['note']}")
        else:
            cpu = f"  (process CPU time {r['cpu_us']:.0f} us)" if "cpu_us" in r else ""
            print(f"  {r['impl']:<38} {r['us']:>11.1f} us  {r['GBps']:>9.2f} GB/s  {100 * r['of_copy']:>6.2f}% of copy{cpu}")


def _goals(results: list[dict], device: torch.device) -> list[str]:
    if device.type != "cuda":
        return ["goals (GPU only): top-K >= 60% of copy bandwidth at batch 32; match + walk <= 20 us: n/a on CPU"]
    lines = []
    for res in results:
        best = [r for r in res["rows"] if r["impl"].startswith("triton") and "us" in r]
        if not best:
            continue
        r = min(best, key=lambda r: r["us"])
        if res["kind"] == "topk" and res["batch"] == 32:
            ok = r["of_copy"] >= TOPK_BW_GOAL
            lines.append(f"goal top-K >= 60% of copy bandwidth at batch 32: {'PASS' if ok else 'FAIL'} "
                         f"({100 * r['of_copy']:.1f}%, {r['impl']})")
        if res["kind"].startswith("walk"):
            ok = r["us"] <= WALK_US_GOAL
            lines.append(f"goal {res['kind']} <= 20 us at batch {res['batch']}: {'PASS' if ok else 'FAIL'} "
                         f"({r['us']:.1f} us, {r['impl']})")
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="bench.py kernels", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes (sequences)")
    p.add_argument("--iters", type=int, default=0, help="calls per measurement (0: 200 on GPU, 7 on CPU)")
    p.add_argument("--rules", default="greedy,viterbi")
    p.add_argument("--skip-compile", action="store_true", help="do not time torch.compile(reference)")
    p.add_argument("--no-graphs", action="store_true", help="GPU: skip the CUDA-graph timings")
    p.add_argument("--json", default="", help="also write the results to this file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    iters = args.iters or (200 if device.type == "cuda" else 7)
    batches = [int(b) for b in args.batches.split(",") if b]
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"device: {name} | torch {torch.__version__} | triton {triton_version}")
    copy_bw = copy_bandwidth(device, iters)
    print(f"copy bandwidth (read + write of a {'1 GiB' if device.type == 'cuda' else '256 MiB'} tensor): {copy_bw / 1e9:.1f} GB/s")
    results = []
    for batch in batches:
        results.append(bench_topk(device, batch, iters, copy_bw, args.skip_compile, not args.no_graphs))
        _print_result(results[-1])
        for rule in args.rules.split(","):
            results.append(bench_walk(device, batch, rule, iters, copy_bw, args.skip_compile, not args.no_graphs))
            _print_result(results[-1])
    for line in _goals(results, device):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "copy_GBps": copy_bw / 1e9, "results": results}, f, indent=1)
    return results
