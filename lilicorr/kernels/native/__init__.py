"""C kernels built with the machine's C compiler on first use and called through ctypes, or not at all.

Why C, and why built here: the one kernel so far (lilicorr_head.c, the LiLiCorr head's batch-1 proposal) is a
chain of ~60 tiny GEMMs and pointwise ops whose cost inside the engine is framework code and buffers that the
target's pass has just pushed out of the caches. Plain loops over the weights cost a fraction of that. The build
uses `-march=native` (the vector width of this CPU), so it happens on the machine that runs it: once per source,
compiler flags and CPU, into a cache directory (LILICORR_NATIVE_CACHE, else $XDG_CACHE_HOME/lilicorr/native, else
~/.cache/lilicorr/native), a ~1 s compile the first time. Where there is no compiler or the build fails, `get()`
returns None after one warning and the caller runs its torch path, which computes the same thing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
# -O3 for the vectoriser; no -ffast-math: inf and NaN keep their meaning and sums their written order
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC"]


def cache_dir() -> Path:
    env = os.environ.get("LILICORR_NATIVE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lilicorr" / "native"


def _cpu_identity() -> str:
    """What -march=native compiles for: the architecture and, on Linux, the CPU's model and feature flags."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    parts.append(line.strip())
                if len(parts) >= 3:
                    break
    except OSError:
        pass
    return "\n".join(parts)


class NativeLibrary:
    """The shared library of one C source in this folder, built and loaded on the first `get()`, once per process
    (thread-safe: the engine may run in a server thread). what: the warning's name for it; fallback: what runs
    instead. `declare` sets each function's ctypes signature once it is loaded."""

    def __init__(self, source: str, what: str, fallback: str, declare):
        self.source, self.what, self.fallback, self._declare = HERE / source, what, fallback, declare
        self._lib: Optional[ctypes.CDLL] = None
        self.failed: Optional[str] = None  # why building or loading failed (then get() is None)
        self._lock = threading.Lock()

    def get(self) -> Optional[ctypes.CDLL]:
        if self._lib is not None or self.failed is not None:
            return self._lib
        with self._lock:
            if self._lib is None and self.failed is None:
                try:
                    lib = ctypes.CDLL(str(self.build()))
                    self._declare(lib)
                    self._lib = lib
                except Exception as e:  # noqa: BLE001 - no compiler, a compile error, a load error
                    self.failed = f"{type(e).__name__}: {e}"[:400]
                    warnings.warn(f"{self.what} unavailable ({self.failed}); using {self.fallback}", RuntimeWarning)
        return self._lib

    def build(self) -> Path:
        """The library's path, compiled first unless a build of this source, flags, compiler and CPU exists."""
        cc = os.environ.get("CC", "cc")
        if shutil.which(cc) is None:
            raise RuntimeError(f"no C compiler ({cc!r} is not on PATH; set CC)")
        source = self.source.read_bytes()
        key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), cc.encode(),
                                         _cpu_identity().encode()])).hexdigest()[:16]
        out_dir = cache_dir()
        out_dir.mkdir(parents=True, exist_ok=True)
        lib = out_dir / f"{self.source.stem}-{key}.so"
        if lib.exists():
            return lib
        # a private name first, then an atomic rename: processes that build at once never load half a file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, "-o", tmp, str(self.source), "-lm"], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed on {self.source.name}: {done.stderr.strip()[-300:]}")
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return lib


HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def huge_page_buffer(nbytes: int):
    """A uint8 tensor of `nbytes`, 2 MiB-aligned and, on Linux, advised to transparent huge pages (where THP is
    `madvise`, the default on many distributions). Why: a kernel that streams ~1-5 MB of tables right after the
    target's pass has evicted them pays a TLB miss and a prefetcher restart every 4 KB page; one huge page per
    2 MiB removes both. Elsewhere, or if the advice fails, it is an ordinary aligned buffer."""
    import torch

    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE_PAGE
    buf = raw[start:start + nbytes]
    if platform.system() == "Linux" and nbytes:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            length = -(-nbytes // HUGE_PAGE) * HUGE_PAGE  # whole huge pages, inside `raw`
            libc.madvise(ctypes.c_void_p(buf.data_ptr()), ctypes.c_size_t(length), _MADV_HUGEPAGE)
        except (OSError, AttributeError):
            pass
    return buf
