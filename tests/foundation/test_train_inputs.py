"""The exports a training run starts from are resolved and checked on the driver, before the feature
cache and Ray: a relative path becomes the absolute one the workers can open; a folder that is not an
export is refused, naming where it was looked for."""

import pytest

from lilicorr.config import load_config
from lilicorr.config import ConfigError
from lilicorr.config.paths import REPO_ROOT
from lilicorr.platform.train.driver import resolve_inputs, train


def test_a_relative_init_from_becomes_the_absolute_export(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    cfg = load_config("smollm2-135m", ["train.init_from=checkpoints/smollm2-135m/dflash"])
    resolve_inputs(cfg)
    assert cfg.train.init_from == str(REPO_ROOT / "checkpoints" / "smollm2-135m" / "dflash")


def test_a_missing_export_is_refused_before_the_shards_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative to another working directory: the case a user hits
    cfg = load_config("tiny-random", ["train.init_from=checkpoints/smollm2-135m/dflash",
                                      f"data.output_dir={tmp_path / 'no-shards'}"])
    with pytest.raises(ConfigError) as e:
        train(cfg, track=False)  # the shards are missing too: the export is checked first
    msg = str(e.value)
    assert "train.init_from=checkpoints/smollm2-135m/dflash" in msg and "no config.json" in msg
    assert str(tmp_path / "checkpoints" / "smollm2-135m" / "dflash") in msg and "repository root" in msg
