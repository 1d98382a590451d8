"""Quiet consoles: a job's own progress lines on the console, everything (Ray, DeepSpeed, MLflow) in a log file.

    from lilicorr.platform.console import quiet_console
    quiet_console("train", enabled=argv is None)   # first thing in a job's main(), after argument parsing

The process's stdout and stderr (file descriptors 1 and 2, so C-level writes and the lines Ray forwards from
workers too) are piped through a filter: every byte goes to outputs/logs/<job>-<UTC time>.log (folder:
$LILICORR_LOG_DIR), and the console keeps
  - the platform's own lines, tagged `[job] ...` (`(RayTrainWorker pid=..)` prefixes of forwarded ones dropped),
  - anything else a job prints (summaries, the JSON result line), and tqdm-style bars,
but not library log records below ERROR (Ray's `INFO worker.py:..`, Ray Train's PlacementGroupCleaner /
PreemptionWatcher warnings with their tracebacks, Ray Data's progress dump, DeepSpeed's and MLflow's INFO),
Python warnings, or untagged lines forwarded from Ray workers and actors. An uncaught exception in the job
goes to the console in full. LILICORR_VERBOSE=1 keeps the console unfiltered (the file is still written).
Ray Data's progress bars are off (RAY_DATA_DISABLE_PROGRESS_BARS, read when ray.data is imported): stages
report their own progress lines. Pure Python, no Ray import.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the "(Worker pid=..)" prefix even off a terminal
# "(RayTrainWorker pid=123, ip=10.0.0.1) text" — a line Ray forwarded from a worker process.
_FORWARDED = re.compile(r"^\((?:.*?\s)?pid=\d+(?:, ip=[^)\s]+)?\)\s?(?P<rest>.*)$")
_TAGGED = re.compile(r"^\[[a-z][a-z0-9_-]*\] ")
_LEVEL = r"(?P<level>TRACE|DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
_LOG_RECORDS = [
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\s+" + _LEVEL + r"\b"),  # Ray, Ray Data/Train
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?\]\s*\[" + _LEVEL + r"\]"),  # DeepSpeed
    re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d " + _LEVEL + r"\b"),  # MLflow
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*" + _LEVEL + r"\b"),
    # Ray's C++ (glog) lines: "[2026-11-30 02:58:33,926 E 18769 18769] core_worker.cc:2465: ..."; E is routine
    # there (the actor-restart notice), so only F (fatal) is kept.
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[IWEF]) \d+ \d+\]"),
    re.compile(r"^" + _LEVEL + r"[: ]"),  # bare "WARNING: ..." / "INFO ..."
]
_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")  # warnings.warn output (its source line follows)
_CONTINUATION = re.compile(r"^(\s|Traceback \(most recent call last\)|During handling|The above exception|"
                           r"[\w.]+(Error|Exception|Warning|Interrupt|Exit)\b)")
_KEEP_LEVELS = {"ERROR", "CRITICAL", "FATAL", "F"}
_LINE_END = re.compile(rb"([\r\n])")  # a bar's \r update ends a record as a line's \n does


class LineFilter:
    """Decides, line by line, what reaches the console (stateful: continuation lines follow their record)."""

    def __init__(self) -> None:
        self._last_kept = True

    def __call__(self, line: str) -> Optional[str]:
        """The text to show for `line` (without its end), or None to keep it off the console."""
        line = _ANSI.sub("", line)
        m = _FORWARDED.match(line)
        if m:
            rest = m.group("rest")
            self._last_kept = bool(_TAGGED.match(rest))
            return rest if self._last_kept else None
        if _TAGGED.match(line):
            self._last_kept = True
            return line
        for pattern in _LOG_RECORDS:
            rec = pattern.match(line)
            if rec:
                self._last_kept = rec.group("level") in _KEEP_LEVELS
                return line if self._last_kept else None
        if _WARNING.match(line):
            self._last_kept = False
            return None
        if _CONTINUATION.match(line) or not line.strip():
            return line if self._last_kept else None
        self._last_kept = True
        return line


class _Pump(threading.Thread):
    """Reads one pipe; writes every record to the log file and the filtered ones to the console fd."""

    def __init__(self, read_fd: int, console_fd: int, log, lock: threading.Lock, verbose: bool):
        super().__init__(daemon=True, name=f"console-pump-{console_fd}")
        self.read_fd, self.console_fd, self.log, self.lock = read_fd, console_fd, log, lock
        self.keep = (lambda line: line) if verbose else LineFilter()
        self.line_kept: Optional[bool] = None  # decision for the rest of a \r-updated line (a bar); None: at a new line

    def run(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                break
            *records, buf = _LINE_END.split(buf + chunk)  # [text, end, text, end, ..., the unfinished rest]
            for raw, end in zip(records[::2], records[1::2]):
                self._record(raw, end)
        if buf:
            self._record(buf, b"\n")
        os.close(self.read_fd)

    def _record(self, raw: bytes, end: bytes) -> None:
        with self.lock:
            if end == b"\n":  # bars (\r updates) only on the console: the file keeps whole lines
                self.log.write(raw + b"\n")
                self.log.flush()
        text = raw.decode("utf-8", errors="replace")
        if self.line_kept is None:  # a line's first segment decides for its \r updates (a worker's bar stays out)
            shown = self.keep(text)
            self.line_kept = shown is not None
        else:
            shown = text if self.line_kept else None
        if end == b"\n":
            self.line_kept = None
        if shown is not None:
            with contextlib.suppress(OSError):  # the console went away (closed pipe): the log file has everything
                os.write(self.console_fd, shown.encode("utf-8", errors="replace") + end)


_active: Optional[Path] = None


def quiet_console(job: str, enabled: bool = True) -> Optional[Path]:
    """Tee fds 1/2 into outputs/logs/<job>-<time>.log and filter the console; returns the log path.

    `enabled=False` (a job's main() called from Python, e.g. by tests, rather than run as a program) leaves
    the process alone. Idempotent: a second call returns the first log path.
    """
    global _active
    if not enabled:
        return None
    if _active is not None:
        return _active
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    folder = Path(os.environ.get("LILICORR_LOG_DIR") or "outputs/logs").absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}.log"
    log = open(path, "ab", buffering=0)
    verbose = os.environ.get("LILICORR_VERBOSE", "0") not in ("", "0", "false")
    lock = threading.Lock()
    sys.stdout.flush()
    sys.stderr.flush()
    saved, pumps = {}, []
    for fd in (1, 2):
        saved[fd] = os.dup(fd)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)
        pump = _Pump(read_fd, saved[fd], log, lock, verbose)
        pump.start()
        pumps.append(pump)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)

    def excepthook(kind, value, tb):  # an uncaught error reaches the console whole, whatever the filter says
        text = "".join(traceback.format_exception(kind, value, tb)) + f"[{job}] full log: {path}\n"
        os.write(saved[2], text.encode())
        with lock:
            log.write(text.encode())

    def restore() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd in (1, 2):
            os.dup2(saved[fd], fd)  # closes the pipes' last write ends: the pumps see EOF
        for pump in pumps:
            pump.join(timeout=5)
        log.close()

    sys.excepthook = excepthook
    atexit.register(restore)
    _active = path
    print(f"[{job}] full log: {path}", flush=True)
    return path
