"""A function compiled by torch.compile on its first call, once per process, with a fallback when it cannot be.

Why one helper: the engine's compiled CPU paths (kernels/gemv.py's GEMV, engine/one_row_layer.py's decoder layer,
models/heads/lilicorr_fast.py's batch-1 head pass) share the same contract: compile lazily (the first call pays
Inductor's codegen; the decoder's warm-up makes that call), compile once even when the engine runs in a server
thread, and on a machine where Inductor cannot compile (no C++ compiler, a codegen bug) warn once and let the
caller run its eager reference, which computes the same thing.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional

import torch


def _raise_recompile_limits() -> None:
    # A process that decodes many models (the test suite, an evaluation grid) compiles again per shape layout:
    # past 64 in one test process. Past Dynamo's limits a fullgraph function fails and the caller would fall back
    # to its eager path: leave room (the per-function limit and the one over all functions together).
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 256)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)


class Compiled:
    """`torch.compile(fn, fullgraph=True, **options)` on the first call. what: the warning's name for it;
    fallback: what the caller runs instead. Call it as the function: it returns None when compiling failed
    (now, with one warning, or before), and the caller then runs its reference."""

    def __init__(self, what: str, fallback: str, fn: Callable, threads: Optional[int] = None, **options: Any):
        self.what, self.fallback, self._fn, self._options = what, fallback, fn, options
        # intra-op threads for its calls (compile included); None: the process's. The count is process-wide: for a
        # function whose caller runs alone meanwhile (the engine's step, a row's head)
        self.threads = threads
        self._compiled: Optional[Callable] = None
        self.failed: Optional[str] = None  # why compiling failed
        self._lock = threading.Lock()

    def compiled(self) -> Callable:
        if self._compiled is not None:  # the hot path (30 layer calls a token): no lock once it exists
            return self._compiled
        with self._lock:
            if self._compiled is None:
                _raise_recompile_limits()
                self._compiled = torch.compile(self._fn, fullgraph=True, **self._options)
            return self._compiled

    def fail(self, e: Exception) -> None:
        self.failed = f"{type(e).__name__}: {e}"[:300]
        warnings.warn(f"{self.what} unavailable ({self.failed}); using {self.fallback}", RuntimeWarning)

    def __call__(self, *args: Any, strict: bool = False) -> Any:
        """fn(*args) compiled, or None where it cannot be (strict: raise instead, for tests and benchmarks)."""
        if self.failed is not None and not strict:
            return None
        n = torch.get_num_threads()
        fewer = self.threads is not None and self.threads < n
        try:
            if fewer:  # cheap: oneDNN and OpenMP keep their pools across a switch
                torch.set_num_threads(self.threads)
            return self.compiled()(*args)
        except Exception as e:  # noqa: BLE001 - Inductor's failures have many types (no compiler, codegen)
            if strict:
                raise
            self.fail(e)
            return None
        finally:
            if fewer:
                torch.set_num_threads(n)
