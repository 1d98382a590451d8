"""`load_config`: a named preset, `section.field=value` overrides, every check, every path resolved."""

from __future__ import annotations

from lilicorr.config.choices import ConfigError
from lilicorr.config.overrides import check_choices, set_key
from lilicorr.config.paths import resolve_paths
from lilicorr.config.presets import PRESETS
from lilicorr.config.rules import check_rules
from lilicorr.config.schema import Config


def load_config(preset: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The named preset with `section.field=value` overrides applied, each checked; then the cross-field rules
    (rules.py), then every relative path made absolute against the working directory and a missing input refused
    (paths.py). Each failure is a ConfigError naming the field."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    cfg = PRESETS[preset]()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        key, raw = item.split("=", 1)
        set_key(cfg, key.strip(), raw)
    check_choices(cfg)
    check_rules(cfg)
    resolve_paths(cfg)
    return cfg
