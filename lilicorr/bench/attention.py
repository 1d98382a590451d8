"""CPU attention over a long KV cache (not a test): `python jobs/bench.py attention [--keys 256,2048,8192] [--queries 1,8]`.

What one layer of a decode or verification step costs at a given context length, per path of
engine/attention.py: SDPA (`enable_gqa`, the flash kernel; what one row takes today) and the two batched matmuls
with the query heads of a KV head stacked (`_eager`'s order, what batched one-token steps take). Each timing
cycles over enough distinct K/V caches (>= --mb MB) that no cache level holds them, as the layers of a step
meet them; the shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head dim 64) unless given. Outputs of the
two paths are compared. One JSON line.
"""

from __future__ import annotations

import argparse

import torch

from lilicorr.bench.harness import json_line, median_s
from lilicorr.engine.attention import _eager, _sdpa, additive, step_mask


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py attention", description=__doc__.split("\n")[0])
    ap.add_argument("--keys", default="256,2048,8192", help="context lengths S (keys per row)")
    ap.add_argument("--queries", default="1,8", help="new tokens T per step (1: AR, 8: a block's verification)")
    ap.add_argument("--heads", default="9,3,64", help="query heads, KV heads, head dim")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    ap.add_argument("--mb", type=int, default=128, help="K/V megabytes cycled per cell")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    nq, nkv, hd = (int(v) for v in args.heads.split(","))
    scale = hd ** -0.5
    cells = []
    with torch.no_grad():
        for s in (int(v) for v in args.keys.split(",")):
            n = max(2, args.mb * 2 ** 20 // (2 * nkv * s * hd * 4))
            kv = [(torch.randn(1, nkv, s, hd), torch.randn(1, nkv, s, hd)) for _ in range(n)]
            for t in (int(v) for v in args.queries.split(",")):
                q = torch.randn(1, nq, t, hd)
                mask = additive(step_mask(torch.tensor([s - t]), s, t, None), q.dtype)  # (1, 1, T, S)
                paths = {"sdpa": lambda k, v: _sdpa(q, k, v, mask, scale),
                         "stacked_matmul": lambda k, v: _eager(q, k, v, mask, scale)}
                ref = paths["sdpa"](*kv[0])
                cell = {"keys": s, "queries": t, "layers_cycled": n}
                for name, fn in paths.items():
                    cell[f"{name}_ms"] = median_s(lambda: [fn(k, v) for k, v in kv], args.reps) / n * 1e3
                cell["max_abs_diff"] = float((paths["stacked_matmul"](*kv[0]) - ref).abs().max())
                cell["stacked_over_sdpa"] = cell["stacked_matmul_ms"] / cell["sdpa_ms"]
                print(f"[bench attention] S {s:6d} T {t:2d}: sdpa {cell['sdpa_ms']:7.3f} ms, stacked matmuls "
                      f"{cell['stacked_matmul_ms']:7.3f} ms a layer ({cell['stacked_over_sdpa']:.2f}x), "
                      f"max |diff| {cell['max_abs_diff']:.1e}", flush=True)
                cells.append(cell)
    res = {"bench": "attention", "threads": torch.get_num_threads(), "heads": [nq, nkv, hd], "cells": cells}
    return json_line(res)
