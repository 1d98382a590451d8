"""kernels/compiled.Compiled: its intra-op thread count during a call, and its fallback contract."""

import pytest
import torch

from lilicorr.kernels.compiled import Compiled


def _plus_one(x):
    return x + 1


def test_threads_apply_during_the_call_and_are_restored():
    seen = []
    c = Compiled("test fn", "eager", _plus_one, threads=1, dynamic=False)
    inner = c.compiled

    def spy():
        seen.append(torch.get_num_threads())  # the count when the compiled function is called
        return inner()

    c.compiled = spy
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = c(torch.zeros(3), strict=True)
        assert torch.equal(out, torch.ones(3))
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_failed_compile_warns_once_then_returns_none():
    def bad(x):
        raise RuntimeError("no compiler here")

    c = Compiled("test fn", "eager", bad, threads=1)
    c.compiled = lambda: bad  # as if Inductor failed at the first call
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.warns(RuntimeWarning, match="test fn unavailable"):
            assert c(torch.zeros(1)) is None
        assert c(torch.zeros(1)) is None and "no compiler here" in c.failed
        assert torch.get_num_threads() == 2  # restored on the failing path too
        with pytest.raises(RuntimeError):
            c(torch.zeros(1), strict=True)
    finally:
        torch.set_num_threads(before)
