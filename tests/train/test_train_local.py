"""train.runner=local (lilicorr/platform/train/local.py): the training loop in one process, without Ray, DeepSpeed or
MLflow. Against the reference, a Ray Train + DeepSpeed run (ZeRO-0, fp32) of the same config: the same weights after
the same steps. Without those packages at all (a bare GPU machine): jobs/train.py trains, checkpoints, exports, and a
rerun resumes from the newest checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lilicorr.config import ConfigError, load_config
from lilicorr.platform.train.shards import synthetic_rows, write_shards

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    cfg = load_config("tiny-random")
    write_shards(synthetic_rows(16, cfg.target.vocab_size, 24, 60, seed=1, prefix="tr"), data, "train", rows_per_shard=6)
    write_shards(synthetic_rows(4, cfg.target.vocab_size, 24, 60, seed=2, prefix="ho"), data, "heldout", rows_per_shard=4)
    return data


def _overrides(data: Path, out: Path, runner: str) -> list[str]:
    # two micro-batches a step (accumulation), clipping on, fp32 (DeepSpeed's ZeRO-0 fp32 engine is torch's AdamW)
    return [f"data.output_dir={data}", f"train.output_dir={out}", f"train.runner={runner}", "train.num_workers=1",
            "train.global_batch_size=4", "train.micro_batch=2", f"train.max_steps={STEPS}", "train.checkpoint_every=2",
            "train.validate_every=100", "train.log_every=1", "train.precision=fp32", "train.zero_stage=0",
            "optim.grad_clip=0.5"]


@pytest.mark.slow
def test_local_runner_takes_the_steps_ray_train_with_deepspeed_takes(tmp_path, local_ray_2cpu):
    from lilicorr.platform.train.driver import train

    data = _data(tmp_path)
    ray_run = train(load_config("tiny-random", _overrides(data, tmp_path / "ray", "ray")), track=False)
    local_run = train(load_config("tiny-random", _overrides(data, tmp_path / "local", "local")), track=False)
    assert ray_run.steps == local_run.steps == STEPS
    assert Path(local_run.checkpoint_dir).parent == tmp_path / "local" / "local"
    ours, ref = (load_file(str(Path(r.export_dir) / "model.safetensors")) for r in (local_run, ray_run))
    start = load_file(str(Path(local_run.checkpoint_dir).parent / "checkpoint_step_0000002" / "export" /
                          "model.safetensors"))
    assert ours.keys() == ref.keys()
    moved = 0
    for k in ref:
        torch.testing.assert_close(ours[k], ref[k], atol=1e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
        moved += not torch.equal(ours[k], start[k])
    assert moved > len(ref) // 2  # step 3 changed the weights: the comparison covers a real update
    for key in ("val_loss", "val_sim_acceptance_length"):
        assert local_run.metrics[key] == pytest.approx(ray_run.metrics[key], rel=1e-5), key


# Blocks these imports in the child: what a GPU machine with torch alone lacks.
# (A spec whose loader refuses: transformers' own find_spec probes must not fail, an import must.)
BLOCK = """
import importlib.abc, importlib.machinery, sys
class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "deepspeed", "mlflow"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (blocked: a machine without it)")
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _Absent())
sys.argv = ["jobs/train.py", *sys.argv[1:]]
import runpy
runpy.run_path("jobs/train.py", run_name="__main__")
"""


def _train_without_ray(overrides: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", BLOCK, "--preset", "tiny-random", *overrides], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "not tracked" in p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_local_runner_trains_and_resumes_without_ray_deepspeed_or_mlflow(tmp_path):
    data = _data(tmp_path)
    out = tmp_path / "run"
    first = _train_without_ray(_overrides(data, out, "local"))
    assert first["steps"] == STEPS and first["mlflow_run_id"] is None
    assert (Path(first["export_dir"]) / "model.safetensors").exists()
    kept = sorted(p.name for p in (out / "local").iterdir())
    assert kept == ["checkpoint_step_0000002", "checkpoint_step_0000003"]  # the newest two
    assert "val_sim_acceptance_length" in first["metrics"]
    # the same command with a larger budget resumes from step 3 (AdamW's own counter: 5 steps, not 2 or 8)
    again = _train_without_ray([*_overrides(data, out, "local"), "train.max_steps=5"])
    assert again["steps"] == 5
    from train_helpers import optimizer_steps_taken

    assert optimizer_steps_taken(again["checkpoint_dir"]) == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_local_runner_refuses_use_gpu_without_cuda_before_loading_anything(tmp_path):
    from lilicorr.platform.train.driver import train

    cfg = load_config("tiny-random", [*_overrides(_data(tmp_path), tmp_path / "run", "local"), "train.use_gpu=true"])
    with pytest.raises(RuntimeError, match="train.use_gpu=false"):
        train(cfg, track=False)
    assert not (tmp_path / "run" / "local").exists()


@pytest.mark.parametrize("extra,field", [(["train.num_workers=2"], "train.num_workers"),
                                         (["train.feature_cache=true"], "train.feature_cache"),
                                         (["train.max_failures=1", "train.fail_at_step=2"], "train.fail_at_step")])
def test_local_runner_refuses_what_needs_ray_naming_the_fix(extra, field):
    with pytest.raises(ConfigError, match=field) as e:
        load_config("tiny-random", ["train.runner=local", *extra])
    assert "train.runner=ray" in str(e.value) or "rerun" in str(e.value)


def test_local_engine_accumulates_clips_and_steps_at_the_boundary():
    """Two micro-batches a step: the loss halved each, no update before the boundary; at it the gradient clipped to
    optim.grad_clip (the pre-clipping norm reported) and one AdamW step; bf16 runs the forward under autocast."""
    from lilicorr.platform.train.local import LocalEngine

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)  # SGD: the update is the (clipped) gradient itself
    engine = LocalEngine(lin, opt, grad_accum=2, grad_clip=0.1, bf16=False, device=torch.device("cpu"))
    x = torch.randn(5, 4)
    before = lin.weight.detach().clone()
    engine.backward(engine(x).pow(2).sum())
    assert not engine.is_gradient_accumulation_boundary()
    engine.step()
    assert torch.equal(lin.weight, before)  # not yet
    engine.backward(engine(x).pow(2).sum())
    assert engine.is_gradient_accumulation_boundary()
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict({"weight": before, "bias": lin.bias.detach().clone()})
    ref(x).pow(2).sum().backward()  # the mean of two equal micro-batches' gradients
    full = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()]))
    engine.step()
    assert engine.get_global_grad_norm() == pytest.approx(float(full), rel=1e-5)
    step = before - lin.weight.detach()
    torch.testing.assert_close(step, ref.weight.grad * (0.1 / (float(full) + 1e-6)))  # clipped to norm 0.1
    assert all(p.grad is None for p in lin.parameters())  # zeroed for the next step
    bf16 = LocalEngine(lin, opt, grad_accum=1, grad_clip=0.0, bf16=True, device=torch.device("cpu"))
    assert bf16(x).dtype == torch.bfloat16 and lin.weight.dtype == torch.float32
