"""Sections of a benchmark run that tells the truth when cut short (lilicorr.bench.gpu_decode uses it).

Each section's figures go into one dict, rewritten to the --out file after every section (atomically:
a run killed mid-section leaves the last complete file), with its wall time in `section_s`. A section
that raises records "<name>_error" and joins `failed_sections` (the caller exits non-zero: no silent
fallback); one that would pass the time limit is recorded as skipped and not started.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from lilicorr.bench.harness import logger

log = logger("gpu")


@dataclass
class Context:
    """What an extra section (the caller's) gets: the run's settings and its results so far."""

    dry_run: bool
    dev: object  # torch.device
    res: dict
    fail: Callable[[str, str], None]  # (name, why): a problem that leaves the section's figures standing
    state: dict = field(default_factory=dict)


@dataclass
class Section:
    name: str
    need_s: float  # seconds it needs on the GPU; skipped when less is left
    fn: Callable[[Context], dict]


class Run:
    def __init__(self, limit_s: float, out: str = "", dry_run: bool = False):
        self.t0, self.limit, self.out, self.dry_run = time.perf_counter(), limit_s, out, dry_run
        self.res: dict = {"section_s": {}, "failed_sections": []}

    def left(self) -> float:
        return self.limit - (time.perf_counter() - self.t0)

    def fail(self, name: str, msg: str) -> None:
        """A section's problem that leaves its figures standing (e.g. the engine's graph fell back)."""
        self.res[f"{name}_error"] = msg
        self.res["failed_sections"].append(name)
        log(f"{name} FAILED: {msg}")

    def write(self) -> None:
        """The JSON so far, replaced atomically: a run killed mid-section leaves the last complete file."""
        self.res["wall_s"] = time.perf_counter() - self.t0
        if self.out:
            tmp = f"{self.out}.tmp"
            with open(tmp, "w") as f:
                f.write(json.dumps(self.res) + "\n")
            os.replace(tmp, self.out)

    def section(self, name: str, need_s: float, fn) -> None:
        need_s = 0.0 if self.dry_run else need_s
        if self.left() < need_s:
            self.res[f"{name}_skipped"] = f"time limit: {self.left():.0f} s left, needs ~{need_s:.0f} s"
            log(self.res[f"{name}_skipped"] + f" ({name})")
            self.write()
            return
        t = time.perf_counter()
        try:
            self.res.update(fn())
        except Exception as e:  # recorded and made loud by the exit status, the other figures still print
            self.fail(name, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        self.res["section_s"][name] = round(time.perf_counter() - t, 2)
        log(f"{name}: {self.res['section_s'][name]:.1f} s (run {time.perf_counter() - self.t0:.0f} s)")
        self.write()
