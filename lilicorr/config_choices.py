"""The fixed value sets of config fields (typing.Literal aliases) and the checked assignment of values.

A field annotated with one of these aliases accepts only the listed strings: `head.kind=lilicor` fails in
`load_config` (so in the job's first second, before torch or Ray load) with a message naming the key, the
bad value and the allowed ones. Pure Python, like lilicorr.config; the modules that act on a value
(models.heads, engine.systems, platform.regenerate, platform.train) keep their own checks, and
tests/foundation/test_foundation_config.py asserts their value lists equal the ones here.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A preset, key or value the config does not know. The message names it."""


TargetArch = Literal["llama", "qwen3"]  # Llama family (incl. SmolLM2) | Qwen3 (q/k norms)
TargetDType = Literal["float32", "bfloat16", "float16"]
RandomTokenizer = Literal["smollm2", "qwen3"]  # the text of a random target: SmolLM2's or the packaged Qwen3 BPE
DrafterInit = Literal["random", "target_top"]
HeadKind = Literal["lilicorr", "none", "domino", "dspark"]  # "none" = vanilla DFlash
DecodeRule = Literal["greedy", "viterbi"]
DSparkProposal = Literal["deterministic", "sampled"]
Schedule = Literal["cosine", "constant", "wsd"]
Precision = Literal["bf16", "fp32"]
GenerateBackend = Literal["engine", "vllm", "hf"]  # vllm: Ray Data LLM on GPU nodes (config_rules._vllm, regenerate/vllm_processor.py)
DrafterMask = Literal["learned", "token"]  # the mask slots' input: a learned vector | mask_token_id's embedding
LiLiCorrEmbed = Literal["rms", "raw"]  # LiLiCorr head choices (issue 16): ours first, then Model-Optimizer's
LiLiCorrFeatureNorm = Literal["none", "layernorm"]
LiLiCorrInit = Literal["torch", "normal"]
LiLiCorrTarget = Literal["mean", "fused"]
LiLiCorrPartial = Literal["cut", "drop"]
LiLiCorrSlotBias = Literal["per_layer", "shared"]  # ours first, then vLLM's / SGLang's LiLiCorrHead (issue 39)
LiLiCorrNormEps = Literal["fixed", "drafter"]  # the head's RMSNorm eps: 1e-6 | the drafter's rms_norm_eps (vLLM's)
TrainLabels = Literal["target", "corpus"]
FeatureDType = Literal["bfloat16", "float32"]
EngineBackend = Literal["auto", "fast", "reference"]  # how the engine levers are read (engine/backend.py)
SweepSearch = Literal["grid", "random"]
SweepScheduler = Literal["asha", "none"]
SystemName = Literal["ar", "dflash", "lilicorr", "lilicorr-margin", "lilicorr-viterbi", "domino", "dspark",
                     "dspark-sampled", "ddtree"]


def choices_of(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values when `tp` is a Literal (or Optional[Literal]); None for open types."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = choices_of(arg)
            if found is not None:
                return found
    return None


def type_name(tp: Any) -> str:
    allowed = choices_of(tp)
    if allowed is not None:
        return "one of " + ", ".join(map(str, allowed))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


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
# `cfg` below is a lilicorr.config.Config: a dataclass whose fields (but `preset`) are section dataclasses.


def sections(cfg: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg) if f.name != "preset"]


def set_key(cfg: Any, key: str, raw: Any) -> None:
    """cfg.<section>.<field> = raw coerced to the field's type; ConfigError naming the key otherwise."""
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
