"""Benchmarks (not tests): `python jobs/bench.py engine|kernels|gemv|attention|serve|train-step|gpu|vllm|vllm-lilicorr-head|regen-vllm|stages|head|acceptance|concurrency [...]`.

Each subcommand is `main(argv)` of its module in lilicorr/bench/ (the one benchmark package: it may import the
platform, serve_apps, the engine, models and kernels; nothing in lilicorr imports it). `gpu` runs on CPU with
`--dry-run`.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

SUBCOMMANDS = {"engine": "lilicorr.bench.engine", "kernels": "lilicorr.bench.kernels",
               "gemv": "lilicorr.bench.gemv", "attention": "lilicorr.bench.attention",
               "serve": "lilicorr.bench.serve_load", "train-step": "lilicorr.bench.train_step",
               "train-memory": "lilicorr.bench.train_memory",
               "gpu": "lilicorr.bench.gpu_decode", "vllm": "lilicorr.bench.vllm_peer",
               "vllm-lilicorr-head": "lilicorr.bench.vllm_lilicorr_head",
               "regen-vllm": "lilicorr.bench.regen_vllm",
               "stages": "lilicorr.bench.stages", "head": "lilicorr.bench.head_cost",
               "acceptance": "lilicorr.bench.acceptance",
               "concurrency": "lilicorr.bench.concurrency"}


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: bench.py {{{','.join(SUBCOMMANDS)}}} [args...]", file=sys.stderr)
        sys.exit(2)
    return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
