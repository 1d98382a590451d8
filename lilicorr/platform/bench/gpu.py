"""`python jobs/bench.py gpu [--dry-run] [--out FILE]`: the GPU decoding figures (lilicorr.engine.measure_gpu).

Kept free of Ray, MLflow and DeepSpeed imports: the GPU machine has none of them.
"""

from lilicorr.engine.measure_gpu import main

__all__ = ["main"]
