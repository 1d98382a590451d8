"""The sweep's search space: `sweep.space` entries parsed and checked before Ray starts (pure Python).

    "loss.gamma=0.1|0.25|0.5"     grid values (search=grid) or random choices (search=random)
    "loss.lam=loguniform:0.1:10"  a distribution (random search only); also uniform:lo:hi, randint:lo:hi

Every value (for a distribution: both bounds) is applied to a copy of the config through the same check a
`section.field=value` override passes, so an unknown key or a bad value fails in the first second, naming it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from lilicorr.config import Config, ConfigError, load_config

DISTRIBUTIONS = ("uniform", "loguniform", "randint")


@dataclass(frozen=True)
class Dimension:
    key: str  # section.field
    values: tuple[str, ...] = ()  # override strings (grid / choice)
    dist: str | None = None  # uniform | loguniform | randint
    low: float = 0.0
    high: float = 0.0


def _as_overrides(cfg: Config) -> list[str]:
    from lilicorr.config.overrides import override_text

    return [f"{k}={override_text(list(v) if isinstance(v, tuple) else v)}" for k, v in cfg.flat().items()
            if k != "preset" and not k.startswith("sweep.")]


def parse_dimension(entry: str) -> Dimension:
    if "=" not in entry:
        raise ConfigError(f"sweep.space entry {entry!r} is not of the form section.field=v1|v2 or section.field=uniform:lo:hi")
    key, spec = (x.strip() for x in entry.split("=", 1))
    if key.startswith("sweep."):
        raise ConfigError(f"sweep.space entry {entry!r}: the sweep section itself cannot be swept")
    head = spec.split(":", 1)[0]
    if head in DISTRIBUTIONS:
        parts = spec.split(":")
        if len(parts) != 3:
            raise ConfigError(f"sweep.space entry {entry!r}: a distribution is {head}:low:high")
        try:
            low, high = float(parts[1]), float(parts[2])
        except ValueError:
            raise ConfigError(f"sweep.space entry {entry!r}: bounds must be numbers") from None
        if not low < high or (head == "loguniform" and low <= 0):
            raise ConfigError(f"sweep.space entry {entry!r}: needs low < high (and low > 0 for loguniform)")
        return Dimension(key, dist=head, low=low, high=high)
    values = tuple(v.strip() for v in spec.split("|"))
    if not spec or any(v == "" for v in values):
        raise ConfigError(f"sweep.space entry {entry!r} has an empty value")
    return Dimension(key, values=values)


def parse_space(cfg: Config) -> list[Dimension]:
    """`sweep.space` and the other sweep settings, checked; raises ConfigError naming the problem.

    sweep.search and sweep.scheduler were checked against their choices when the config was loaded."""
    sw = cfg.sweep
    for name in ("num_samples", "reduction_factor", "max_concurrent_trials"):
        if getattr(sw, name) < 1:
            raise ConfigError(f"sweep.{name} must be >= 1")
    if sw.top_k < 0:
        raise ConfigError("sweep.top_k must be >= 0")
    if sw.scheduler == "asha" and not sw.metric.startswith("val_"):
        raise ConfigError(f"sweep.metric {sw.metric!r}: the objective is a validation metric (val_*), never a training loss")
    dims = [parse_dimension(e) for e in sw.space]
    keys = [d.key for d in dims]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"sweep.space names a key twice: {keys}")
    if not dims:
        raise ConfigError("sweep.space is empty: name at least one section.field to sweep")
    for d in dims:
        if d.dist is not None and sw.search == "grid":
            raise ConfigError(f"sweep.space {d.key}: a {d.dist} distribution needs sweep.search=random (grid takes v1|v2)")
        bounds = (d.low, d.high) if d.dist != "randint" else (int(d.low), int(d.high))
        for v in (d.values if d.dist is None else bounds):
            apply_overrides(cfg, {d.key: v})  # the command line's check: the config with this one value
    return dims


def tune_space(dims: list[Dimension], search: str) -> dict[str, Any]:
    """{section.field: Tune domain}: grid_search for grid, choice / uniform / loguniform / randint for random."""
    from ray import tune

    out: dict[str, Any] = {}
    for d in dims:
        if d.dist in ("uniform", "loguniform"):
            out[d.key] = getattr(tune, d.dist)(d.low, d.high)
        elif d.dist == "randint":
            out[d.key] = tune.randint(int(d.low), int(d.high))
        elif search == "grid":
            out[d.key] = tune.grid_search(list(d.values))
        else:
            out[d.key] = tune.choice(list(d.values))
    return out


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """A copy of `cfg` with {section.field: value} applied through the command-line check."""
    items = [f"{k}={v}" for k, v in sorted(overrides.items())]
    out = load_config(cfg.preset, [*_as_overrides(cfg), *items])
    out.sweep = cfg.sweep
    return out


def sweep_name(cfg: Config, kind: str = "sweep") -> str:
    """`sweep.name`, or <kind>-<preset>-<hash of everything that shapes the trials>: the same command resumes."""
    if cfg.sweep.name:
        return cfg.sweep.name
    d = cfg.to_dict()
    for section in ("tracking", "demo", "eval", "engine"):
        d.pop(section, None)
    d["train"] = {k: v for k, v in d["train"].items() if k not in ("output_dir", "log_every")}
    d["sweep"] = {k: v for k, v in d["sweep"].items() if k not in ("output_dir", "max_concurrent_trials")}
    digest = hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{kind}-{cfg.preset}-{digest}"
