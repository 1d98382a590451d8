"""Evaluation: benchmark prompts, cells fanned out over Ray actors, MLflow child runs, paper-style reports.

  benchmarks.py  packaged + hub benchmarks as chat rows (column -> prompt mapping), skipped with a reason
  plan.py        systems x benchmarks x settings -> cells; which export each system uses
  cells.py       one cell in one process: engine systems and the transformers peers (hf, hf-pld)
  workers.py     Ray actors running cells (one GPU each on a cluster)
  run.py         the driver: parent run, fan-out, a child run per cell, speedups over AR
  records.py     cells read back from MLflow
  tables.py      the paper's tables (1/5, 3, 2/13, 11, 12) as Markdown + CSV
  plots.py       τ per benchmark, acceptance per slot, throughput vs concurrency
  report.py      report.md + CSV + PNG, logged back to MLflow
"""
