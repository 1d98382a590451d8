"""Benchmarks' platform side: asset loading, the transformers baseline and the CLIs `jobs/bench.py` runs."""
