"""One typed config for every job (pure Python, no torch or Ray: models and engine read it too), with named
presets and `section.field=value` overrides, so a bad flag fails in well under 2 s.

    cfg = load_config("smollm2-135m", ["head.top_k=4", "train.max_steps=50"])

    choices.py    the Literal value sets (and the tuples derived from them), ConfigError
    overrides.py  parsing: overrides coerced to each field's type, --config files read and written
    schema.py     the dataclasses: one per section, and Config
    paths.py      path fields made absolute on the driver, a missing input refused (REPO_ROOT)
    presets.py    named presets: plain functions returning a Config (torchtitan style)
    rules.py      cross-field rules, each error naming the field that fixes it
    load.py       load_config: preset, overrides, choices, rules, paths

Each module imports only modules above it in this list, never one below: no cycle, no late import.
"""

from lilicorr.config.choices import ConfigError
from lilicorr.config.load import load_config
from lilicorr.config.overrides import check_choices
from lilicorr.config.presets import PRESETS
from lilicorr.config.schema import (Config, DataConfig, DemoConfig, DrafterConfig, EngineConfig, EvalConfig, HeadConfig,
                                    LossConfig, OptimConfig, SweepConfig, TargetConfig, TrackingConfig, TrainConfig)

__all__ = ["Config", "ConfigError", "DataConfig", "DemoConfig", "DrafterConfig", "EngineConfig", "EvalConfig",
           "HeadConfig", "LossConfig", "OptimConfig", "PRESETS", "SweepConfig", "TargetConfig", "TrackingConfig",
           "TrainConfig", "check_choices", "load_config"]
