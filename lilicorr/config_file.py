"""Config files for `--config FILE`: YAML or JSON mapping `section.field` keys to values.

    loss.gamma: 0.5
    train.max_steps: 40
    sweep.space: ["loss.gamma=0.1|0.5", "loss.lam=0|1"]
    head: {top_k: 4}          # a whole section as a mapping works too

Values become `section.field=value` override strings, so a file passes exactly the check a command line
does (lilicorr.config.load_config). Pure Python (PyYAML imported only for .yaml/.yml files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lilicorr.config import Config, ConfigError


def _override_text(value: Any) -> str:
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
            out += [f"{key}.{k}={_override_text(v)}" for k, v in value.items()]
        else:
            out.append(f"{key}={_override_text(value)}")
    return out


def write_config_file(cfg: Config, path: str | Path, header: str = "", skip: tuple[str, ...] = ()) -> Path:
    """Every field of `cfg` as `section.field: value` YAML that `--config FILE` reads back to the same config."""
    import yaml

    flat = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.flat().items()
            if k != "preset" and k not in skip}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {line}" for line in header.splitlines()] + [f"# preset: {cfg.preset}"]
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(flat, sort_keys=True, allow_unicode=True))
    return path
