"""Building the native C kernels (kernels/native: the native batch-1 LiLiCorr head's lilicorr_head.c): a missing
compiler is one warning and no library, and a build is cached per source and machine. The head's proposals through
the kernel against its modules: tests/parity/test_parity_lilicorr_head.py."""

import warnings

import pytest

from lilicorr.kernels.native import NativeLibrary


def test_a_missing_compiler_is_one_warning_and_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-lilicorr")
    monkeypatch.setenv("LILICORR_NATIVE_CACHE", str(tmp_path))
    lib = NativeLibrary("lilicorr_head.c", "test kernel", "its reference", lambda lib: None)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert lib.get() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second get() is silent
        assert lib.get() is None
    assert "no-such-compiler-lilicorr" in lib.failed


def test_the_build_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("LILICORR_NATIVE_CACHE", str(tmp_path))
    first = NativeLibrary("lilicorr_head.c", "test kernel", "its reference", lambda lib: None)
    path = first.build()
    assert path.parent == tmp_path and path.suffix == ".so"
    stamp = path.stat().st_mtime_ns
    assert NativeLibrary("lilicorr_head.c", "t", "r", lambda lib: None).build() == path  # reused, not rebuilt
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no half-written temporaries left behind
