"""The fixed value sets of config fields: typing.Literal aliases, and the tuples derived from them.

A field annotated with one of these aliases accepts only the listed strings: `head.kind=lilicor` fails in
`load_config` (so in the job's first second, before torch or Ray load) with a message naming the key, the
bad value and the allowed ones. Code that acts on a value takes its set from here (`HEAD_KINDS`,
`PRECISIONS`, ...: `typing.get_args` of the alias), so each set is written once; code that maps each
value to behaviour (engine.systems.SYSTEMS, models.target's dtypes, the LR schedules) is checked against the
alias by tests/foundation/test_foundation_config.py. Pure Python, imports nothing of lilicorr.
"""

from __future__ import annotations

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
RegenerateRunner = Literal["ray", "local"]  # local: this process, no Ray (one machine; regenerate/pipeline.py)
TrainRunner = Literal["ray", "local"]  # local: this process, no Ray, DeepSpeed or MLflow needed (train/local.py)
GenerateBackend = Literal["engine", "vllm", "hf"]  # vllm: Ray Data LLM on GPU nodes (regenerate/vllm_processor.py)
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
CpuOneRow = Literal["measure", "plain", "packed"]  # the target's one-row projections (engine.cpu_one_row)
SweepSearch = Literal["grid", "random"]
SweepScheduler = Literal["asha", "none"]
SystemName = Literal["ar", "dflash", "lilicorr", "lilicorr-margin", "lilicorr-viterbi", "domino", "dspark",
                     "dspark-sampled", "ddtree"]


# The value sets as tuples, in the Literal's order: what code outside the config checks a value against.
TARGET_ARCHS = typing.get_args(TargetArch)
HEAD_KINDS = typing.get_args(HeadKind)
PRECISIONS = typing.get_args(Precision)
DRAFTER_MASKS = typing.get_args(DrafterMask)
SWEEP_SEARCHES = typing.get_args(SweepSearch)
SWEEP_SCHEDULERS = typing.get_args(SweepScheduler)


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
