"""The cluster path on the CPU: the qwen3-8b preset's scale-shaped twin (`qwen3-8b-debug`: Qwen3 architecture,
its tokenizer and 151,936-token vocabulary, block 16, K 8, the paper's anchor density, a bf16 target, DeepSpeed bf16
with ZeRO-2, micro-batch 1 with 2 accumulation steps over 2 Ray Train workers) run regenerate -> train -> validate
-> export -> evaluate -> serve, as torchtitan runs its real configs as CPU debug models. This is what keeps the
qwen3 presets from rotting: every stage below is the code a GPU cluster runs, at tiny hidden sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lilicorr.config import load_config

pytestmark = pytest.mark.slow

IM_START, VOCAB = 151644, 151936  # Qwen3's <|im_start|> and vocabulary size


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, local_ray_2cpu):
    """Regenerate + train once for the module (the stages after them read these outputs)."""
    from lilicorr.platform.regenerate.pipeline import run_regeneration
    from lilicorr.platform.train.driver import train

    tmp = tmp_path_factory.mktemp("scale")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlruns.db")
    mp.delenv("LILICORR_PARENT_RUN_ID", raising=False)
    # The preset's log_every: the last step (2) always logs its metrics, the figures these tests read; logging
    # step 1 too only cost an extra metrics pass (a full-vocabulary head pass) per rank.
    cfg = load_config("qwen3-8b-debug", [f"data.output_dir={tmp / 'data'}", f"train.output_dir={tmp / 'run'}",
                                         f"tracking.tracking_uri=sqlite:///{tmp}/mlruns.db"])
    try:
        regen = run_regeneration(cfg)
        result = train(cfg)
    finally:
        mp.undo()
    return tmp, cfg, regen, result


def test_regeneration_writes_qwen3_rows(pipeline):
    import pyarrow.parquet as pq

    tmp, cfg, regen, _ = pipeline
    rows = [r for f in sorted((tmp / "data").glob("*/*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(rows) >= 6 and {"train", "heldout"} <= {p.name for p in (tmp / "data").iterdir()}
    for r in rows:
        ids, mask = r["input_ids"], r["loss_mask"]
        assert len(ids) == len(mask) and max(ids) < VOCAB and ids[0] == IM_START  # the ChatML prompt, Qwen3's ids
        assert 0 < sum(mask) < len(mask)  # the regenerated answer is supervised, the prompt is not
    assert regen["manifest"]["target"] == "random"


def test_train_runs_bf16_deepspeed_with_accumulation_and_validates(pipeline):
    import torch
    from safetensors.torch import load_file

    tmp, cfg, _, result = pipeline
    assert result.steps == cfg.train.max_steps == 2
    assert result.metrics["val_rows"] >= 1 and result.metrics["val_sim_acceptance_length"] >= 1.0
    ranks = sorted(p.name for p in Path(result.checkpoint_dir).glob("optim*.safetensors"))
    assert ranks == ["optim_rank0.safetensors", "optim_rank1.safetensors"]  # ZeRO-2: one partition per rank
    export = Path(result.export_dir)
    meta = json.loads((export / "config.json").read_text())
    assert meta["config"]["train"]["precision"] == "bf16" and meta["mask_token_id"] == 151669
    tensors = load_file(str(export / "model.safetensors"))
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.bfloat16}


def test_export_reproduces_the_runs_validation(pipeline):
    from lilicorr.platform.train.validate import validate_export

    tmp, cfg, _, result = pipeline
    again = validate_export(result.export_dir, str(tmp / "data"), cfg.train.seed)
    assert again["rows"] == result.metrics["val_rows"]
    assert again["sim_acceptance_length"] == pytest.approx(result.metrics["val_sim_acceptance_length"], abs=1e-6)
    assert again["loss"] == pytest.approx(result.metrics["val_loss"], rel=2e-2)  # bf16 sums in another order


def test_evaluate_the_export_against_ar(pipeline):
    from lilicorr.platform.evaluate.run import EvalArgs, evaluate

    tmp, cfg, _, result = pipeline
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlruns.db")
    try:
        ecfg = load_config("qwen3-8b-debug", [f"tracking.tracking_uri=sqlite:///{tmp}/mlruns.db",
                                              "tracking.experiment=scale-eval", "engine.max_new_tokens=8"])
        outcome = evaluate(ecfg, EvalArgs(systems=["ar", "lilicorr"], benchmarks=["mt-bench"], num_prompts=1,
                                          checkpoint=result.export_dir))
    finally:
        mp.undo()
    assert [r.get("error") for r in outcome.results] == [None, None]
    by = {r["cell"]["system"]: r["metrics"] for r in outcome.results}
    assert by["lilicorr"]["tau"] >= 1.0 and by["ar"]["generated_tokens"] == by["lilicorr"]["generated_tokens"] == 8


def test_serve_the_export_over_http(pipeline):
    import httpx

    from lilicorr.serve_apps.launch import free_port
    from lilicorr.serve_apps.launch import start_serve, stop_serve
    from lilicorr.serve_apps.loading import ServeSpec

    tmp, cfg, _, result = pipeline
    spec = ServeSpec(preset="qwen3-8b-debug", overrides=["engine.max_new_tokens=8"], systems=["lilicorr", "ar"],
                     checkpoints=[f"lilicorr={result.export_dir}"], api_key_env="LILICORR_TEST_NO_KEY", torch_threads=1)
    url = start_serve(spec, "127.0.0.1", free_port())
    try:
        models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert {m["id"] for m in models} == {"qwen3-8b-debug-lilicorr", "qwen3-8b-debug-ar"}
        body = {"model": "qwen3-8b-debug-lilicorr", "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 6, "temperature": 0}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["completion_tokens"] >= 1 and isinstance(out["choices"][0]["message"]["content"], str)
        bad = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": -1}, timeout=30)
        assert 400 <= bad.status_code < 500
    finally:
        stop_serve()
