"""Parsing: `section.field=value` overrides coerced to each field's type, and `--config FILE` files.

    set_key(cfg, "head.top_k", "4")          # ConfigError naming the key, the value and the allowed ones
    read_config_file("best.yaml")            # -> ["loss.gamma=0.5", "train.max_steps=40", ...]

A config file is YAML or JSON mapping `section.field` keys to values (a whole section as a mapping works too):

    loss.gamma: 0.5
    train.max_steps: 40
    sweep.space: ["loss.gamma=0.1|0.5", "loss.lam=0|1"]
    head: {top_k: 4}

Its values become override strings, so a file passes exactly the check a command line does
(lilicorr.config.load_config). Pure Python (PyYAML imported only for .yaml/.yml files).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

from lilicorr.config.choices import ConfigError, choices_of, type_name


def coerce(raw: Any, tp: Any) -> Any:
    """Turn a command-line string (or a JSON value) into a value of type `tp`, or raise ValueError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null", ""))):
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(raw, inner[0])
    if origin is Literal:
        if raw not in args:
            close = difflib.get_close_matches(str(raw), [str(a) for a in args], n=1)
            raise ValueError(f"did you mean {close[0]!r}?" if close else "not an allowed value")
        return raw
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        s = str(raw).lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ValueError("not a boolean (use true/false)")
    if tp is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError("not an integer")
        return int(raw)
    if tp is float:
        if isinstance(raw, bool):
            raise ValueError("not a number")
        return float(raw)
    if tp is str:
        if not isinstance(raw, str):
            raise ValueError("not a string")
        return raw
    if origin in (list, tuple):
        items = raw
        if isinstance(raw, str):
            items = json.loads(raw) if raw.strip().startswith("[") else [x for x in raw.split(",") if x]
        if not isinstance(items, (list, tuple)):
            raise ValueError("not a list")
        if origin is tuple:
            if len(items) != len(args):
                raise ValueError(f"needs {len(args)} items")
            return tuple(coerce(x, a) for x, a in zip(items, args))
        return [coerce(x, args[0]) for x in items]
    raise TypeError(f"unsupported config type {tp}")


# ----------------------------------------------------------------------------- checked assignment
# `cfg` below is a lilicorr.config.Config (schema.py imports this module, so it is not imported here): a
# dataclass whose fields (but `preset`) are section dataclasses.


def sections(cfg: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg) if f.name != "preset"]


# Keys that were removed, each with the value every run had before (a saved config holding it loads as it ran)
# and what replaced it; any other value is refused, naming the replacement (ignoring it would run something else).
REMOVED_KEYS = {
    "engine.cpu_gemv": (False, "the Inductor-compiled one-row layer and GEMV were deleted (F.linear measured faster: "
                               "docs/results.md); one-token steps run the target's scripted layers "
                               "(engine.cpu_script_layers) with F.linear's GEMV"),
    "engine.cpu_compile_head": (True, "the Inductor-compiled one-row LiLiCorr head was deleted (the C call measured "
                                      "faster: docs/results.md); one greedy fp32 row runs the C call "
                                      "(engine.cpu_native_head=true) or the head's modules (false)"),
}


def set_key(cfg: Any, key: str, raw: Any) -> None:
    """cfg.<section>.<field> = raw coerced to the field's type; ConfigError naming the key otherwise."""
    if key in REMOVED_KEYS:
        old, replaced = REMOVED_KEYS[key]
        if coerce(raw, type(old)) != old:
            raise ConfigError(f"{key}={raw!r}: this option was removed: {replaced}. Drop it from the config")
        return
    parts = key.split(".")
    if len(parts) != 2:
        raise ConfigError(f"override key {key!r} must be section.field (sections: {', '.join(sections(cfg))})")
    section_name, field_name = parts
    if section_name not in sections(cfg):
        raise ConfigError(f"unknown config section {section_name!r} in {key!r}; sections: {', '.join(sections(cfg))}")
    section = getattr(cfg, section_name)
    hints = typing.get_type_hints(type(section))
    if field_name not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(section))
        raise ConfigError(f"unknown config key {key!r}; {section_name} has: {known}")
    try:
        value = coerce(raw, hints[field_name])
    except (ValueError, TypeError) as e:
        raise ConfigError(f"bad value {raw!r} for {key} (expected {type_name(hints[field_name])}): {e}") from None
    setattr(section, field_name, value)


def check_choices(cfg: Any) -> None:
    """ConfigError if a field with a fixed value set holds another value (a preset, or code, set it)."""
    for section_name in sections(cfg):
        section = getattr(cfg, section_name)
        for name, tp in typing.get_type_hints(type(section)).items():
            allowed = choices_of(tp)
            value = getattr(section, name)
            optional_none = value is None and type(None) in typing.get_args(tp)
            if allowed is not None and value not in allowed and not optional_none:
                raise ConfigError(f"bad value {value!r} for {section_name}.{name} (expected {type_name(tp)})")


# ----------------------------------------------------------------------------- config files


def override_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return str(value)


def read_config_file(path: str | Path) -> list[str]:
    """The file's settings as override strings (applied before the command line's, which win)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise ConfigError(f"config file {str(path)!r} is not valid {path.suffix.lstrip('.') or 'JSON'}: {e}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of section.field: value")
    out: list[str] = []
    for key, value in data.items():
        if key == "preset":
            continue  # the preset comes from --preset; a file may record it for the reader
        if "." not in str(key) and isinstance(value, dict):
            out += [f"{key}.{k}={override_text(v)}" for k, v in value.items()]
        else:
            out.append(f"{key}={override_text(value)}")
    return out


def write_config_file(cfg: Any, path: str | Path, header: str = "", skip: tuple[str, ...] = ()) -> Path:
    """Every field of `cfg` as `section.field: value` YAML that `--config FILE` reads back to the same config."""
    import yaml

    flat = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.flat().items()
            if k != "preset" and k not in skip}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {line}" for line in header.splitlines()] + [f"# preset: {cfg.preset}"]
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(flat, sort_keys=True, allow_unicode=True))
    return path
