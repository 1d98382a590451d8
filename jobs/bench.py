"""Benchmarks (not tests): `python jobs/bench.py SUBCOMMAND [...]`, SUBCOMMAND one of SUBCOMMANDS below.

Each subcommand is `main(argv)` of its module in lilicorr/bench/ (the one benchmark package: it may import the
platform, serve_apps, the engine, models and kernels; nothing in lilicorr imports it). `gpu` runs on CPU with
`--dry-run`.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

SUBCOMMANDS = {"engine": "engine", "kernels": "kernels", "gemv": "gemv", "attention": "attention",
               "serve": "serve_load", "train-step": "train_step", "train-memory": "train_memory", "gpu": "gpu_decode",
               "vllm": "vllm_peer", "vllm-lilicorr-head": "vllm_lilicorr_head", "regen-vllm": "regen_vllm",
               "stages": "stages", "head": "head_cost", "acceptance": "acceptance",
               "concurrency": "concurrency"}  # subcommand -> its module in lilicorr.bench


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: bench.py {{{','.join(SUBCOMMANDS)}}} [args...]", file=sys.stderr)
        sys.exit(2)
    return importlib.import_module("lilicorr.bench." + SUBCOMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
