"""Quiet consoles: the job's own lines on the console, everything in the log file the job names."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from lilicorr.platform.console import LineFilter, quiet_console

ROOT = Path(__file__).resolve().parents[2]

# Lines as Ray 2.60, Ray Train V2, DeepSpeed 0.19 and MLflow 3 print them (taken from real runs), in order.
CHATTER_AND_OURS = [
    ("[regenerate] embedded:sharegpt: 8 conversations in 2 shards of 4", True),
    ("2026-11-30 02:58:05,360\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled", False),
    ("2026-11-30 02:58:27,372\tINFO worker.py:2038 -- Started a local Ray instance.", False),
    ("[2026-11-30 02:58:33,926 E 18769 18769] core_worker.cc:2465: Actor with class name: 'MapWorker'", False),
    ("\x1b[36m(MapWorker(MapBatches(ConversationRegenerator)) pid=19740)\x1b[0m [regenerate] actor pid 19740: "
     "4 conversations", "[regenerate] actor pid 19740: 4 conversations"),
    ("\x1b[36m(TrainController pid=2211)\x1b[0m Attempting to start training worker group of size 2", False),
    ("(TrainController pid=2211) [State Transition] INITIALIZING -> SCHEDULING.", False),
    ("(RayTrainWorker pid=2301, ip=10.0.0.3) [train] step 10/60 loss 9.1", "[train] step 10/60 loss 9.1"),
    ("2026-11-30 03:10:01,002\tWARNING placement_group_cleaner.py:120 -- Failed to query the data source.", False),
    ("2026-11-30 03:10:01,005\tWARNING preemption_callback.py:93 -- Failed to kill PreemptionWatcher actor.", False),
    ("Traceback (most recent call last):", False),
    ('  File "/x/ray/train/v2/_internal/callbacks/preemption_callback.py", line 90, in after_controller_finish', False),
    ("ray.exceptions.RayActorError: The actor died unexpectedly", False),
    ("2026-11-30 03:10:02,100\tINFO logging_progress.py:175 -- ======= Running Dataset: train_0 =======", False),
    ("[2026-11-30 03:10:03,000] [INFO] [real_accelerator.py:260:get_accelerator] Setting ds_accelerator to cpu",
     False),
    ("2026/11/30 03:10:04 INFO mlflow.store.db.utils: Creating initial MLflow database tables...", False),
    ("/x/site-packages/torch/utils/_pytree.py:185: FutureWarning: `isinstance(treespec, LeafSpec)` is deprecated",
     False),
    ("  warnings.warn(", False),
    ("regeneration summary (/tmp/regen)", True),
    ("  rows in        8  (2 shards)", True),
    ("2026-11-30 03:10:05,000\tERROR worker.py:400 -- Unhandled error (suppress with RAY_IGNORE_UNHANDLED_ERRORS)",
     True),
    ("  File \"jobs/x.py\", line 3", True),
    ('{"output_dir": "/tmp/regen", "shards": 2}', True),
]


def test_filter_keeps_the_jobs_lines_and_drops_library_chatter():
    keep = LineFilter()
    for line, expected in CHATTER_AND_OURS:
        want = line if expected is True else (None if expected is False else expected)
        assert keep(line) == want, line


def _run(script: str, tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, str]:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    out = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "LILICORR_LOG_DIR": str(tmp_path / "logs"),
                              **env})
    logs = list((tmp_path / "logs").glob("probe-*.log"))
    assert len(logs) == 1, logs
    return out, logs[0].read_text()


SCRIPT = """
    import logging, os, sys
    from lilicorr.platform.console import quiet_console
    quiet_console("probe")
    print("[probe] stage 1/2")
    sys.stderr.write("2026-11-30 02:58:27,372\\tINFO worker.py:2038 -- Started a local Ray instance.\\n")
    os.write(2, b"(RayTrainWorker pid=7) noise from a worker\\n")  # fd-level, as Ray's log monitor writes
    os.write(2, b"(MapWorker(X) pid=9) Loading weights:   0%|  |\\rLoading weights: 100%|##|\\n")  # a worker's bar
    sys.stderr.write("[probe] shards 1/2\\r[probe] shards 2/2\\n")  # the job's own bar
    logging.basicConfig(format="%(asctime)s\\t%(levelname)s %(filename)s:%(lineno)d -- %(message)s")
    try:
        raise RuntimeError("actor gone")
    except RuntimeError:
        logging.getLogger("ray.train").warning("Failed to kill PreemptionWatcher actor.", exc_info=True)
    print("[probe] stage 2/2", flush=True)
    print('{"result": 1}')
"""


def test_console_shows_stage_lines_and_the_file_has_everything(tmp_path):
    out, log = _run(SCRIPT, tmp_path)
    assert out.returncode == 0, out.stderr
    shown = out.stdout.splitlines()
    assert shown[0].startswith("[probe] full log: ") and shown[0].endswith(".log")
    assert shown[1:] == ["[probe] stage 1/2", "[probe] stage 2/2", '{"result": 1}']
    assert out.stderr.splitlines() == ["[probe] shards 1/2", "[probe] shards 2/2"]  # (\r read as a line end)
    for text in ("Started a local Ray instance", "noise from a worker", "PreemptionWatcher", "RuntimeError: actor gone",
                 "[probe] stage 2/2", '{"result": 1}'):
        assert text in log


def test_verbose_console_and_uncaught_errors_reach_the_console(tmp_path):
    out, log = _run(SCRIPT, tmp_path, LILICORR_VERBOSE="1")
    assert "noise from a worker" in out.stderr and "PreemptionWatcher" in out.stderr
    crash, log2 = _run(SCRIPT.replace('print(\'{"result": 1}\')', 'raise ValueError("bad shard 3")'),
                       tmp_path / "crash")
    assert crash.returncode == 1
    assert "ValueError: bad shard 3" in crash.stderr and "[probe] full log: " in crash.stderr
    assert "Traceback (most recent call last)" in crash.stderr and "ValueError: bad shard 3" in log2


def test_disabled_leaves_the_process_alone():
    before = [os.fstat(fd) for fd in (1, 2)]
    assert quiet_console("x", enabled=False) is None
    assert [os.fstat(fd) for fd in (1, 2)] == before
