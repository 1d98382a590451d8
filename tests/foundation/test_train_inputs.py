"""Every path field is resolved once, on the driver, when the config is loaded (lilicorr/config/paths.py): a
relative path becomes the absolute one the Ray workers can open; a missing input is refused then, naming the
field, where it was looked for and the fix, before the feature cache, the target or Ray start."""

import pytest

from lilicorr.cli import parse_job_args
from lilicorr.config import ConfigError, load_config
from lilicorr.config.paths import REPO_ROOT
from lilicorr.platform.train.driver import resolve_inputs, train

SHIPPED = REPO_ROOT / "checkpoints" / "smollm2-135m"


def test_a_relative_init_from_becomes_the_absolute_export_when_loaded(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    cfg = load_config("smollm2-135m", ["train.init_from=checkpoints/smollm2-135m/dflash"])
    assert cfg.train.init_from == str(SHIPPED / "dflash")
    resolve_inputs(cfg)  # again on the driver: nothing changes
    assert cfg.train.init_from == str(SHIPPED / "dflash")


def test_every_relative_path_is_made_absolute_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text("{}\n")
    cfg = load_config("smollm2-135m", ["train.output_dir=runs/a", "data.output_dir=data", "eval.output_dir=ev",
                                       "sweep.output_dir=sw", "train.feature_cache_dir=feat", "data.source=chats.jsonl",
                                       f"train.init_from={SHIPPED / 'dflash'}", "tracking.tracking_uri=sqlite:///m.db"])
    here = tmp_path.resolve()
    assert (cfg.train.output_dir, cfg.data.output_dir, cfg.eval.output_dir, cfg.sweep.output_dir) == (
        str(here / "runs" / "a"), str(here / "data"), str(here / "ev"), str(here / "sw"))
    assert (cfg.train.feature_cache_dir, cfg.data.source) == (str(here / "feat"), str(here / "chats.jsonl"))
    assert cfg.tracking.tracking_uri == f"sqlite:///{here / 'm.db'}"
    ship = load_config("smollm2-135m-ship")  # the packaged corpus, from any working directory
    assert ship.data.output_dir == str(REPO_ROOT / "corpora" / "smollm2-135m" / "sharegpt-v1")
    remote = load_config("tiny-random", ["data.output_dir=s3://bucket/data", "tracking.tracking_uri=http://h:5000",
                                         "drafter.checkpoint=z-lab/Qwen3-8B-DFlash-b16"])
    assert (remote.data.output_dir, remote.tracking.tracking_uri, remote.drafter.checkpoint) == (
        "s3://bucket/data", "http://h:5000", "z-lab/Qwen3-8B-DFlash-b16")


@pytest.mark.parametrize("override, field, what", [
    ("train.init_from=checkpoints/smollm2-135m/dflash", "train.init_from", "has no config.json"),
    ("data.output_dir=corpora/smollm2-135m/sharegpt-v0", "data.output_dir", "is not a packaged corpus"),
    ("target.source=local:models/smollm2", "target.source", "does not exist"),
    ("data.source=chats.jsonl", "data.source", "does not exist"),
    ("drafter.checkpoint=./dflash", "drafter.checkpoint", "does not exist"),
])
def test_a_missing_input_is_refused_when_loaded_naming_the_field(tmp_path, monkeypatch, override, field, what):
    monkeypatch.chdir(tmp_path)  # relative to another working directory: the case a user hits
    with pytest.raises(ConfigError) as e:
        load_config("tiny-random", [override])
    msg = str(e.value)
    assert msg.startswith(f"{override}: {tmp_path.resolve()}") and what in msg
    assert f"working directory {tmp_path.resolve()}: run from the repository root or give an absolute path" in msg


def test_a_missing_checkpoint_argument_is_refused_before_the_job_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    def add(p):
        p.add_argument("--checkpoint", default=None)

    with pytest.raises(SystemExit) as e:
        parse_job_args("job", add, ["--preset", "tiny-random", "--checkpoint", "checkpoints/smollm2-135m"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--checkpoint=checkpoints/smollm2-135m" in err and f"{SHIPPED} exists" in err
    args, _ = parse_job_args("job", add, ["--preset", "tiny-random", "--checkpoint", f"dflash={SHIPPED / 'dflash'}"])
    assert args.checkpoint == f"dflash={SHIPPED / 'dflash'}"
    monkeypatch.chdir(REPO_ROOT)
    args, _ = parse_job_args("job", add, ["--preset", "tiny-random", "--checkpoint", "checkpoints/smollm2-135m"])
    assert args.checkpoint == str(SHIPPED)


def test_a_config_changed_after_loading_is_resolved_again_before_the_shards_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("tiny-random", [f"data.output_dir={tmp_path / 'no-shards'}"])
    cfg.train.init_from = "checkpoints/smollm2-135m/dflash"  # e.g. a sweep trial's override
    with pytest.raises(ConfigError) as e:
        train(cfg, track=False)  # the shards are missing too: the export is checked first
    msg = str(e.value)
    assert "train.init_from=checkpoints/smollm2-135m/dflash" in msg and "no config.json" in msg
    assert str(tmp_path / "checkpoints" / "smollm2-135m" / "dflash") in msg and "repository root" in msg
