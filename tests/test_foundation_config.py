"""Typed config: presets, overrides, and clear errors that name the bad piece."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lilicorr.config import PRESETS, Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_qwen3_8b_preset_has_table4_values():
    cfg = load_config("qwen3-8b")
    assert (cfg.drafter.block_size, cfg.head.top_k, cfg.head.embed_dim, cfg.head.sigma) == (16, 8, 1024, 8.0)
    assert (cfg.head.num_layers, cfg.head.width, cfg.head.num_heads, cfg.head.ffn_width) == (2, 1024, 8, 2048)
    assert (cfg.drafter.loss_decay_beta, cfg.loss.lam, cfg.loss.gamma, cfg.loss.rho) == (7.0, 1.0, 0.25, 2.0)
    assert (cfg.optim.lr_drafter, cfg.optim.lr_head) == (6e-4, 1.5e-4)
    assert (cfg.optim.weight_decay_drafter, cfg.optim.weight_decay_head) == (0.0, 0.01)
    assert (cfg.optim.warmup_fraction, cfg.optim.grad_clip, cfg.optim.schedule) == (0.04, 1.0, "cosine")
    assert (cfg.train.global_batch_size, cfg.train.seq_len, cfg.train.epochs) == (64, 3072, 6)
    assert cfg.drafter.mask_token_id == 151669 and cfg.target.arch == "qwen3"


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_round_trips(name):
    cfg = load_config(name)
    assert cfg.preset == name
    assert Config.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_overrides_are_typed():
    cfg = load_config("tiny-random", ["head.top_k=5", "loss.mu=0.5", "train.use_gpu=true",
                                      "train.max_steps=none", "optim.betas=0.8,0.9", "eval.benchmarks=mt-bench"])
    assert cfg.head.top_k == 5 and isinstance(cfg.head.top_k, int)
    assert cfg.loss.mu == 0.5 and cfg.train.use_gpu is True and cfg.train.max_steps is None
    assert cfg.optim.betas == (0.8, 0.9) and cfg.eval.benchmarks == ["mt-bench"]


@pytest.mark.parametrize("preset, overrides, names", [
    ("no-such-preset", [], "no-such-preset"),
    ("tiny-random", ["head.topk=3"], "head.topk"),
    ("tiny-random", ["nosection.x=1"], "nosection"),
    ("tiny-random", ["head.top_k=three"], "head.top_k"),
    ("tiny-random", ["train.use_gpu=maybe"], "train.use_gpu"),
    ("tiny-random", ["head.top_k"], "head.top_k"),
])
def test_bad_config_names_the_problem(preset, overrides, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_config(preset, overrides)


JOB_REQUIRED_ARGS = {"generate.py": ["--system", "ar", "--prompts", "in.jsonl", "--out", "out.jsonl"]}


@pytest.mark.parametrize("job", sorted(p.name for p in (ROOT / "jobs").glob("*.py")
                                       if p.name not in ("__init__.py", "bench.py") and not p.name.startswith("_")))
@pytest.mark.parametrize("args, names", [(["--preset", "no-such-preset"], "no-such-preset"),
                                         (["--preset", "tiny-random", "head.topk=3"], "head.topk")])
def test_every_job_rejects_bad_config_within_2s(job, args, names):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, f"jobs/{job}", *args, *JOB_REQUIRED_ARGS.get(job, [])], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert out.returncode != 0
    assert names in out.stderr, out.stderr[-2000:]
    assert elapsed < 2.0, f"{job} took {elapsed:.2f}s to reject a bad config (parse before heavy imports)"
