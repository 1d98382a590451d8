"""Plain tensor functions run by TorchScript's interpreter: scripted once per process, or not at all.

Why: the engine's fp32 CPU steps at small shapes (a block's 8 tokens, the drafter's 2 layers) are chains of many
small ops, and on a 2-core CPU each pays Python's dispatch. The TorchScript interpreter runs the same aten ops without
it: bit-identical results, less time per block (engine/scripted_stack.py, models/drafter_fast.py; how much each:
docs/results.md). torch.compile was measured slower for these steps: its guard checks and calls cost more than the
ops it fuses there.

TorchScript is deprecated since torch 2.13 (still shipped and working): its DeprecationWarning is silenced here,
the one place that scripts. If a torch cannot script a function, `get()` returns None after one warning and the
caller runs its reference code (the modules or eager layers whose ops the scripted functions copy).
"""

from __future__ import annotations

import threading
import warnings
from typing import Callable, Dict, Optional

import torch


class Scripted:
    """`torch.jit.script` of `fns` (name -> function) on the first `get()`, once (thread-safe: the engine may run
    in a server thread). what: the warning's name for them; fallback: what runs instead."""

    def __init__(self, what: str, fallback: str, **fns: Callable):
        self.what, self.fallback, self._fns = what, fallback, fns
        self._scripted: Optional[Dict[str, Callable]] = None
        self.failed: Optional[str] = None  # why scripting failed (then get() is None)
        self._lock = threading.Lock()

    def get(self) -> Optional[Dict[str, Callable]]:
        """{name: scripted function}, or None where TorchScript cannot script them."""
        if self._scripted is not None or self.failed is not None:
            return self._scripted
        with self._lock:
            if self._scripted is None and self.failed is None:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
                        self._scripted = {name: torch.jit.script(fn) for name, fn in self._fns.items()}
                except Exception as e:  # noqa: BLE001 - TorchScript's frontend raises many types
                    self.failed = f"{type(e).__name__}: {e}"[:300]
                    warnings.warn(f"{self.what} unavailable ({self.failed}); using {self.fallback}", RuntimeWarning)
            return self._scripted
