"""Benchmarks (not tests): `python jobs/bench.py engine|kernels|gemv|serve|train-step|gpu|vllm|vllm-lilicorr-head|regen-vllm|stages|head|acceptance|concurrency [...]`.

Each subcommand is `main(argv)` of its module: lilicorr.platform.bench.engine, lilicorr.kernels.bench,
lilicorr.kernels.bench_gemv, lilicorr.serve_apps.bench_serve, lilicorr.platform.bench.gpu (the GPU figures; `--dry-run` on CPU;
here it is given the Serve loader's placement section, since lilicorr/platform does not import serve_apps).
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

SUBCOMMANDS = {"engine": "lilicorr.platform.bench.engine", "kernels": "lilicorr.kernels.bench",
               "gemv": "lilicorr.kernels.bench_gemv",
               "serve": "lilicorr.serve_apps.bench_serve", "train-step": "lilicorr.platform.bench.train_step",
               "train-memory": "lilicorr.platform.bench.train_memory",
               "gpu": "lilicorr.platform.bench.gpu", "vllm": "lilicorr.platform.bench.vllm_peer",
               "vllm-lilicorr-head": "lilicorr.platform.bench.vllm_lilicorr_head",
               "regen-vllm": "lilicorr.platform.bench.regen_vllm",
               "stages": "lilicorr.platform.bench.stages", "head": "lilicorr.platform.bench.head_cost",
               "acceptance": "lilicorr.platform.bench.acceptance",
               "concurrency": "lilicorr.serve_apps.bench_concurrency"}


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: bench.py {{{','.join(SUBCOMMANDS)}}} [args...]", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    if argv[0] == "gpu":  # jobs may join platform and serve_apps; the platform may not
        from lilicorr.serve_apps import bench_gpu_load

        return module.main(argv[1:], extra=bench_gpu_load.sections())
    return module.main(argv[1:])


if __name__ == "__main__":
    main()
