"""When to run a Triton kernel instead of its torch reference.

Triton on CUDA tensors; on CPU tensors only when TRITON_INTERPRET=1 is set (the interpreter must be
switched on before triton is first imported, so set it in the environment of the process). Triton
itself is imported lazily by the kernel modules, so `import lilicorr.kernels` stays cheap and works
on machines without triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os

from torch import Tensor


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


# Whether the running code may take a Triton kernel: a decoder sets it for its own steps (triton_scope, from its
# BackendPlan: engine.use_triton, engine.backend), so building or running a second decoder never changes the
# first's kernels. Outside any scope (kernel tests, training): Triton wherever it can run.
_TRITON: contextvars.ContextVar[bool] = contextvars.ContextVar("lilicorr_triton", default=True)


@contextlib.contextmanager
def triton_scope(enabled: bool):
    """Inside: Triton kernels only if `enabled` (this thread or task only)."""
    token = _TRITON.set(bool(enabled))
    try:
        yield
    finally:
        _TRITON.reset(token)


def use_triton(t: Tensor) -> bool:
    """True when the Triton kernel should handle tensor `t`."""
    if not _TRITON.get() or not triton_available():
        return False
    return t.is_cuda or (t.device.type == "cpu" and interpret_mode())
