"""When to run a Triton kernel instead of its torch reference.

Triton on CUDA tensors; on CPU tensors only when TRITON_INTERPRET=1 is set (the interpreter must be
switched on before triton is first imported, so set it in the environment of the process). Triton
itself is imported lazily by the kernel modules, so `import lilicorr.kernels` stays cheap and works
on machines without triton.
"""

from __future__ import annotations

import importlib.util
import os

from torch import Tensor


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


_ENABLED = True  # engine.use_triton (build_decoder sets it); False = torch references everywhere


def enable_triton(enabled: bool) -> None:
    global _ENABLED
    _ENABLED = bool(enabled)


def use_triton(t: Tensor) -> bool:
    """True when the Triton kernel should handle tensor `t`."""
    if not _ENABLED or not triton_available():
        return False
    return t.is_cuda or (t.device.type == "cpu" and interpret_mode())
