"""`jobs/bench.py train-memory`: the peak memory of one training step per head on the CPU at the real vocabulary,
block and anchor count (small hidden size), today's code against a baseline commit's, side by side; then the
modelled per-GPU figure for Qwen3-8B at Table 4 (memory_model.py) and the micro-batch it implies on 80 GB.

    python jobs/bench.py train-memory [--baseline REF] [--heads none,lilicorr,domino,dspark]
                                      [--anchors 128] [--seq-len 1024] [--hidden 64] [--out FILE]

Each measurement runs in a fresh process (one head, one code version): it builds a random Qwen3-shaped target
(vocab 151,936) and the drafter + head, in fp32 (ours and the baseline) and in bf16 (ours: as DeepSpeed bf16 holds
them beside a bf16 target), resets the kernel's peak-RSS
counter (/proc/self/clear_refs), runs one forward + backward on one sequence and reads VmHWM: "step peak" is that
peak minus the resident size before the step (what the step itself adds). `--baseline REF` checks REF out into
a temporary git worktree and runs the same measurement against its `lilicorr` package (the public JointModel API
is all the measurement uses). A measurement that fails (e.g. out of memory) is reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs in the measured process, against whichever lilicorr is first on sys.path (ours or the baseline's).
MEASURE = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
from lilicorr.config import load_config
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target
a = json.loads(sys.argv[2])
cfg = load_config("tiny-random", [f"head.kind={a['head']}", "target.arch=qwen3", "target.vocab_size=151936",
    f"target.hidden_size={a['hidden']}", "target.num_layers=8", "target.num_heads=4", "target.num_kv_heads=2",
    f"target.head_dim={a['hidden'] // 4}", f"target.intermediate_size={2 * a['hidden']}", f"target.dtype={a['dtype']}",
    "target.tie_word_embeddings=false", "target.max_position_embeddings=8192", "drafter.block_size=16",
    "drafter.mask=token", "drafter.mask_token_id=151669", f"drafter.anchors_per_seq={a['anchors']}",
    "head.top_k=8", f"train.seq_len={a['seq_len']}", f"train.ce_chunk_rows={a['chunk_rows']}"])
torch.manual_seed(0)
m = JointModel(cfg, build_random_target(cfg.target))
dtype = getattr(torch, a["dtype"])
m.drafter.to(dtype); m.head.to(dtype)
ids = torch.randint(0, 151000, (1, a["seq_len"]), generator=torch.Generator().manual_seed(0))
mask = torch.ones_like(ids, dtype=torch.bool)
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
before = rss("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM (peak RSS) to the current RSS
t0 = time.perf_counter()
out = m(ids, mask, generator=torch.Generator().manual_seed(0), with_metrics=False)
out.loss.backward()
wall = time.perf_counter() - t0
print(json.dumps({"step_peak_mb": round((rss("VmHWM:") - before) / 2**20, 1), "before_mb": round(before / 2**20, 1),
                  "step_s": round(wall, 2), "loss": round(float(out.loss), 4)}))
"""


def measure(code_root: Path, head: str, dtype: str, args) -> dict:
    spec = {"head": head, "dtype": dtype, "hidden": args.hidden, "anchors": args.anchors, "seq_len": args.seq_len,
            "chunk_rows": args.chunk_rows}
    env = {**os.environ, "BENCH_THREADS": str(args.threads), "PYTHONPATH": str(code_root)}
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(code_root), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = "killed (out of memory?)" if proc.returncode in (-9, 137) else (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {why}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> dict:
    from lilicorr.bench.memory_model import estimate, largest_micro_batch, qwen3_8b_config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", default="", help="git ref of the code to compare against (e.g. 1f96589)")
    p.add_argument("--heads", default="none,lilicorr,domino,dspark")
    p.add_argument("--anchors", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--chunk-rows", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--world", type=int, default=8, help="ZeRO-2 ranks for the Qwen3-8B estimate")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--estimate-only", action="store_true")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    heads = [h for h in args.heads.split(",") if h]
    result: dict = {"settings": {"vocab": 151936, "block": 16, "anchors": args.anchors, "seq_len": args.seq_len,
                                 "hidden": args.hidden, "chunk_rows": args.chunk_rows}}
    if not args.estimate_only:
        codes = {"ours": ROOT}
        if args.baseline:  # REF checked out into a temporary git worktree
            tree = Path(tempfile.mkdtemp(prefix="lilicorr-baseline-"))
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline],
                           check=True, capture_output=True)
            codes[f"baseline {args.baseline}"] = tree
        print(f"[bench] one step, 1 sequence x {args.seq_len} tokens, {args.anchors} anchors x 15 slots over 151,936 "
              f"tokens, hidden {args.hidden}", flush=True)
        result["cpu"] = {}
        for head in heads:
            row = {}
            # fp32 side by side (the baseline's bf16 step may not run at all: it did not before the chunked losses),
            # then ours in bf16, the dtype the cluster trains in.
            for name, root, dtype in [*((n, r, "float32") for n, r in codes.items()), ("ours", ROOT, "bfloat16")]:
                key = f"{name} {dtype}"
                row[key] = measure(root, head, dtype, args)
                print(f"[bench] {head:9s} {key:26s} {json.dumps(row[key])}", flush=True)
            result["cpu"][head] = row
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    cfg, result["qwen3_8b_estimate"] = qwen3_8b_config(), {}
    for head in heads:
        full = estimate(cfg, head, args.world)
        est = {"total_gb": round(full.total_gb, 1), "parts_gb": full.parts_gb,
               "largest_micro_batch_80gb": largest_micro_batch(cfg, head, args.world)}
        result["qwen3_8b_estimate"][head] = est
        print(f"[bench] Qwen3-8B Table 4 estimate, {head}: {est['total_gb']} GB per GPU at micro-batch 1 (ZeRO-2 over "
              f"{args.world}); largest micro-batch on 80 GB: {est['largest_micro_batch_80gb']}", flush=True)
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return result
