"""Typed config: presets, overrides, and clear errors that name the bad piece."""

import math
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from lilicorr.config import choices as config_choices
from lilicorr.config import PRESETS, Config, ConfigError, HeadConfig, check_choices, load_config

ROOT = Path(__file__).resolve().parents[2]


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


# export.py takes no preset: its config is the export's own (tested below for a folder that is not an export).
@pytest.mark.parametrize("job", sorted(p.name for p in (ROOT / "jobs").glob("*.py")
                                       if p.name not in ("__init__.py", "bench.py", "export.py")
                                       and not p.name.startswith("_")))
@pytest.mark.parametrize("args, names", [(["--preset", "no-such-preset"], "no-such-preset"),
                                         (["--preset", "tiny-random", "head.topk=3"], "head.topk"),
                                         (["--preset", "tiny-random", "head.kind=lilicor"],
                                          "bad value 'lilicor' for head.kind (expected one of lilicorr, none, domino, dspark)")])
def test_every_job_rejects_bad_config_within_2s(job, args, names):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, f"jobs/{job}", *args, *JOB_REQUIRED_ARGS.get(job, [])], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert out.returncode != 0
    assert names in out.stderr, out.stderr[-2000:]
    assert elapsed < 2.0, f"{job} took {elapsed:.2f}s to reject a bad config (parse before heavy imports)"


def test_export_job_rejects_a_folder_that_is_not_an_export(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "jobs/export.py", "--layout", "zlab", str(tmp_path), str(tmp_path / "out")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has no config.json" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- fixed value sets


@pytest.mark.parametrize("key, bad, allowed", [
    ("head.kind", "lilicor", "lilicorr, none, domino, dspark"),
    ("head.decode_rule", "beam", "greedy, viterbi"),
    ("head.dspark_proposal", "random", "deterministic, sampled"),
    ("engine.system", "lilicorr-vitterbi", "ar, dflash, lilicorr, lilicorr-margin, lilicorr-viterbi, domino, dspark, "
                                            "dspark-sampled, ddtree"),
    ("train.precision", "fp16", "bf16, fp32"),
    ("data.generate_backend", "sglang", "engine, vllm, hf"),
    ("optim.schedule", "linear", "cosine, constant, wsd"),
    ("target.arch", "mistral", "llama, qwen3"),
    ("target.dtype", "float64", "float32, bfloat16, float16"),
    ("drafter.init", "target-top", "random, target_top"),
    ("drafter.mask", "learnt", "learned, token"),
    ("head.lilicorr_embed", "rmsnorm", "rms, raw"),
    ("train.labels", "targets", "target, corpus"),
    ("train.feature_dtype", "bf16", "bfloat16, float32"),
    ("sweep.search", "bayes", "grid, random"),
    ("sweep.scheduler", "hyperband", "asha, none"),
])
def test_fixed_value_fields_reject_a_typo_naming_key_value_and_choices(key, bad, allowed):
    with pytest.raises(ConfigError) as err:
        load_config("tiny-random", [f"{key}={bad}"])
    assert f"bad value {bad!r} for {key} (expected one of {allowed})" in str(err.value)
    good = allowed.split(", ")[-1]
    section, name = key.split(".")
    assert getattr(getattr(load_config("tiny-random", [f"{key}={good}"]), section), name) == good


def test_typo_gets_a_suggestion_and_from_dict_checks_choices_too():
    with pytest.raises(ConfigError, match="did you mean 'lilicorr'"):
        load_config("tiny-random", ["head.kind=lilicor"])
    d = load_config("tiny-random").to_dict()
    d["train"]["precision"] = "fp8"
    with pytest.raises(ConfigError, match=r"bad value 'fp8' for train\.precision"):
        Config.from_dict(d)


@pytest.mark.parametrize("key, other, old, replaced", [("engine.cpu_compile_head", "false", "true",
                                                         "engine.cpu_native_head"),
                                                        ("engine.cpu_gemv", "true", "false", "engine.cpu_script_layers")])
def test_a_removed_option_is_refused_naming_what_replaced_it(key, other, old, replaced):
    """engine.cpu_compile_head (the Inductor-compiled one-row head) and engine.cpu_gemv (the compiled one-row layer
    and GEMV) were deleted (issue 40): set otherwise than every run had them, the config is refused naming what runs
    now; the old value loads (the shipped exports' config.json holds it) and leaves no trace in the config."""
    with pytest.raises(ConfigError, match=f"{key}='{other}': this option was removed") as e:
        load_config("tiny-random", [f"{key}={other}"])
    assert replaced in str(e.value)
    cfg = load_config("tiny-random", [f"{key}={old}"])
    assert key not in cfg.flat()
    d = cfg.to_dict()
    d["engine"][key.split(".")[1]] = old == "true"  # a config saved before the removal
    assert Config.from_dict(d).flat() == cfg.flat()


def test_check_choices_catches_a_value_set_in_code():
    cfg = load_config("tiny-random")
    cfg.head.kind = "medusa"
    with pytest.raises(ConfigError, match=r"bad value 'medusa' for head\.kind"):
        check_choices(cfg)


def test_code_that_maps_each_value_covers_the_literal():
    """Value sets are derived from the Literal types (config/choices.py); what maps each value to behaviour (systems,
    dtypes, regeneration backends, schedules, architectures, the LiLiCorr options) must cover exactly its Literal."""
    from lilicorr.engine.systems import SYSTEMS
    from lilicorr.models.target import _DTYPES, hf_config_from_target
    from lilicorr.platform.regenerate.generate import GREEDY_BACKENDS
    from lilicorr.platform.train.schedule import StepPlan, lr_factor

    assert set(typing.get_args(config_choices.SystemName)) == set(SYSTEMS)
    assert set(typing.get_args(config_choices.GenerateBackend)) == {*GREEDY_BACKENDS, "vllm"}  # vllm: its processor
    assert set(typing.get_args(config_choices.TargetDType)) == set(_DTYPES)
    from lilicorr.models.heads.lilicorr import LILICORR_CHOICES
    from lilicorr.platform.train.features import _DTYPES as FEATURE_DTYPES

    hints = typing.get_type_hints(HeadConfig)
    assert {k: typing.get_args(hints[k]) for k in LILICORR_CHOICES} == LILICORR_CHOICES
    assert set(typing.get_args(config_choices.FeatureDType)) == set(FEATURE_DTYPES)
    plan = StepPlan(world_size=1, micro_batch=1, steps_per_epoch=10, total_steps=10, warmup_steps=1)
    assert [lr_factor(5, plan, s) for s in typing.get_args(config_choices.Schedule)] == [
        pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 9))), 1.0, 1.0]
    cfg = load_config("tiny-random")
    for arch, cls in zip(typing.get_args(config_choices.TargetArch), ("LlamaConfig", "Qwen3Config")):
        cfg.target.arch = arch
        assert type(hf_config_from_target(cfg.target)).__name__ == cls


def test_generate_takes_its_system_from_engine_system(tmp_path, capsys):
    """jobs/generate.py without --system decodes with engine.system."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("jobs_generate", ROOT / "jobs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "Hello"}\n')
    argv = ["--preset", "tiny-random", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit) as e:
        generate.main(argv + ["engine.system=lilicorr"])
    assert e.value.code == 2 and "system 'lilicorr' needs --checkpoint DIR or --drafter random" in capsys.readouterr().err
    summary = generate.main(argv + ["engine.system=ar", "--max-new-tokens", "3"])
    assert summary["system"] == "ar" and summary["generated_tokens"] == 3


# ----------------------------------------------------------------------------- cross-field rules (config/rules.py)


@pytest.mark.parametrize("overrides, message", [
    (["train.global_batch_size=6", "train.num_workers=4"],
     "train.global_batch_size=6 is not divisible by train.num_workers=4"),
    (["train.global_batch_size=8", "train.num_workers=2", "train.micro_batch=3"],
     "train.global_batch_size=8 is not divisible by train.num_workers=2 x train.micro_batch=3; "
     "set train.micro_batch to a divisor of 4"),
    (["train.zero_stage=3"], "train.zero_stage=3 is not supported: set train.zero_stage to 0, 1 or 2"),
    (["drafter.block_size=1"], "drafter.block_size=1 must be at least 2"),
    (["drafter.draft_vocab=4", "head.top_k=8"], "head.top_k=8 exceeds the draft vocabulary drafter.draft_vocab=4"),
    (["target.vocab_size=4", "head.top_k=5"], "head.top_k=5 exceeds target.vocab_size=4"),
    (["train.log_every=0"], "train.log_every=0 must be at least 1"),
    (["train.validate_every=0"], "train.validate_every=0 must be at least 1"),
    (["train.val_batch_size=0"], "train.val_batch_size=0 must be at least 1"),
    (["train.distill=1.5"], "train.distill=1.5 must be in [0, 1]"),
    (["optim.warmup_fraction=1.0"], "optim.warmup_fraction=1.0 must be in [0, 1)"),
    (["train.fail_at_step=3"], "with train.max_failures=0 the run fails instead of resuming: set train.max_failures >= 1"),
    (["data.rows_per_shard=4", "data.start_row=6"], "data.start_row=6 must be a multiple of data.rows_per_shard=4"),
    (["data.max_turns=0"], "data.max_turns=0 must be at least 1 (or null: every turn regenerated)"),
])
def test_cross_field_rules_name_the_field_that_fixes_them(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("tiny-random", overrides)
    assert message in str(err.value)


def test_presets_pass_the_rules_and_qwen3_is_sized_for_scale():
    from lilicorr.config.rules import accumulation, check_rules

    for name in PRESETS:
        check_rules(load_config(name))
    t = load_config("qwen3-8b").train
    assert accumulation(t.global_batch_size, t.num_workers, t.micro_batch) == (1, 8)  # 64 = 8 workers x 1 x 8
    assert (t.val_max_rows, t.max_failures, t.precision) == (256, 3, "bf16")
    for name in ("tiny-random", "smollm2-135m"):  # unchanged: fp32, no accumulation, no restarts
        t = load_config(name).train
        assert (t.precision, t.micro_batch, t.max_failures) == ("fp32", None, 0)


def test_v9_presets_are_the_overrides_that_trained_v9():
    """smollm2-135m-epoch is the command line that trained v9's first phase (sessions 26-27, before the preset
    existed) written as a preset, and smollm2-135m-finish that phase with the full vocabulary, 25 steps, a third of
    the LR: a later change to either preset changes what `--preset` reproduces, and this test says so."""
    epoch = load_config("smollm2-135m-ship", [
        "train.runner=local", "train.precision=bf16", "data.output_dir=corpora/smollm2-135m/sharegpt-v2",
        "train.feature_cache=false", "drafter.draft_vocab=8192", "train.max_steps=1000", "train.validate_every=100",
        "train.checkpoint_every=50", "train.log_every=10"]).to_dict()
    epoch["preset"] = "smollm2-135m-epoch"
    assert load_config("smollm2-135m-epoch").to_dict() == epoch
    finish = load_config("smollm2-135m-epoch", ["drafter.draft_vocab=0", "train.max_steps=25",
                                                "train.validate_every=25", "train.checkpoint_every=25",
                                                "train.log_every=5", "optim.lr_drafter=1e-4",
                                                "optim.lr_head=1.5e-4"]).to_dict()
    finish["preset"] = "smollm2-135m-finish"
    assert load_config("smollm2-135m-finish").to_dict() == finish
    # v11's phases over the rows v3 and v4 added (session 29): one pass at the finish's LR
    fresh = load_config("smollm2-135m-epoch", ["train.epochs=1", "train.max_steps=None", "train.validate_every=50",
                                               "optim.lr_drafter=1e-4", "optim.lr_head=1.5e-4"]).to_dict()
    fresh["preset"] = "smollm2-135m-fresh"
    assert load_config("smollm2-135m-fresh").to_dict() == fresh
