"""CPU GEMV benchmark (not a test): `python jobs/bench.py gemv [--threads N] [--shapes 49152x576,3072x576]`.

Per weight shape (default: SmolLM2-135M's fused q/k/v, o, gate/up, down and LM head), one row times
enough distinct weights (>= --mb MB in all) that no cache holds them, as a decode step meets them:
GB/s of weight read by F.linear (MKL's GEMV: what a one-token step takes, kernels/linear.py) and by oneDNN on the
packed weight (kernels/packed_linear.py: what 2+ rows take), side by side in one run, against the machine's read
bandwidth (a sum over one large buffer). Then the same
weights in bf16 on --bf16-rows rows (the engine's bf16 drafter): F.linear vs packed. One JSON line.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lilicorr.bench.harness import json_line, median_s
from lilicorr.kernels.packed_linear import PackedWeight, bf16_supported, can_pack, packed_linear

SMOLLM2_SHAPES = "960x576,576x576,3072x576,576x1536,49152x576"


def read_bandwidth(mb: int, reps: int) -> float:
    """Bytes/s of a sum over one `mb`-MB fp32 buffer (all threads): what a GEMV could reach at most."""
    x = torch.ones(mb * 2 ** 20 // 4)
    return x.numel() * 4 / median_s(lambda: x.sum(), reps)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py gemv", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SMOLLM2_SHAPES, help="OUTxIN,... weight shapes")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    ap.add_argument("--mb", type=int, default=256, help="weight megabytes cycled per shape")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bf16-rows", type=int, default=8, help="rows of the bf16 comparison (0 = skip it)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    res: dict = {"threads": torch.get_num_threads(), "read_gb_s": read_bandwidth(args.mb, args.reps) / 1e9}
    print(f"[bench gemv] threads {res['threads']}; read bandwidth {res['read_gb_s']:.1f} GB/s", flush=True)
    with torch.no_grad():
        for spec in args.shapes.split(","):
            out_f, in_f = (int(v) for v in spec.split("x"))
            n = max(1, args.mb * 2 ** 20 // (out_f * in_f * 4))
            ws = [torch.randn(out_f, in_f) for _ in range(n)]
            x = torch.randn(1, in_f)
            gb = n * out_f * in_f * 4 / 1e9
            mkl = gb / median_s(lambda: [F.linear(x, w) for w in ws], args.reps)
            row = {"mkl_gb_s": mkl}
            line = f"F.linear {mkl:5.1f} GB/s"
            if can_pack(ws[0]):
                packs = [PackedWeight(w) for w in ws]
                row["packed_gb_s"] = gb / median_s(lambda: [packed_linear(x, p) for p in packs], args.reps)
                line += f", oneDNN packed {row['packed_gb_s']:5.1f} GB/s"
                del packs
            if args.bf16_rows and can_pack(ws[0].bfloat16(), bf16=True) and bf16_supported():
                ws = [w.bfloat16() for w in ws]
                xb = torch.randn(args.bf16_rows, in_f).bfloat16()
                packs = [PackedWeight(w) for w in ws]
                row["bf16_linear_gb_s"] = gb / 2 / median_s(lambda: [F.linear(xb, w) for w in ws], args.reps)
                row["bf16_packed_gb_s"] = gb / 2 / median_s(lambda: [packed_linear(xb, p) for p in packs], args.reps)
                line += (f"; bf16 x {args.bf16_rows} rows: F.linear {row['bf16_linear_gb_s']:5.1f}, "
                         f"packed {row['bf16_packed_gb_s']:5.1f} GB/s")
                del packs
            res[spec] = row
            print(f"[bench gemv] {spec:>10}: {line}", flush=True)
            del ws
    return json_line(res)
