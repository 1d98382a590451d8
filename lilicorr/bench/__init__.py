"""Benchmarks (not tests): every module `jobs/bench.py` runs, and harness.py, the steps they share.

This package sits beside jobs/: it may import the platform, serve_apps, the engine, models and kernels, and nothing
in lilicorr imports it (tests/foundation/test_foundation_layout.py). Each CLI module's `main(argv)` is one
`jobs/bench.py` subcommand; `*_side.py` files are scripts for .venv-vllm, never imported. Importing this package
loads nothing: the GPU bench runs where Ray, MLflow and DeepSpeed are absent.
"""
