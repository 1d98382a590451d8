"""Which implementation runs each computation of a decoder: chosen once, when the decoder is built.

`engine.backend` (lilicorr/config/schema.py) says how the engine levers (`engine.cpu_*`, `engine.use_triton`,
`engine.cuda_graphs`) are read:
  auto       each computation takes the fast path its lever asks for where it can run on this device and
             dtype; one that cannot runs the next path down, and the plan's `notes` say which and why
  fast       the same choice, but a fast path a lever asks for that cannot run here raises BackendUnavailable
             naming the path, the reason and the fix, instead of falling back
  reference  what the engine can switch runs its reference: the eager layers, F.linear, the drafter's modules,
             the head's modules, the torch kernels, no CUDA graphs (readable code, for parity checks)

`resolve` returns a frozen BackendPlan naming, per computation, the implementation that runs, and logs it
(logger lilicorr.engine.backend, INFO); systems.py builds the decoder from it (TargetForward's switches, the
head's paths, the drafter's form, the runner's CUDA graphs), and `record()` is what `jobs/bench.py stages` and
`jobs/evaluate.py` write beside their figures. One reference and at most one fast path per computation (issue 40):
the figures that chose each fast path, and the paths deleted, are in docs/results.md.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from lilicorr.config import EngineConfig
from lilicorr.config.choices import CpuOneRow, EngineBackend

log = logging.getLogger(__name__)

# Implementation names: what each field of a BackendPlan may hold
SCRIPTED_STACK = "scripted-stack"  # engine/scripted_stack.py: every layer in one TorchScript call
EAGER_LAYERS = "eager-layers"  # engine/layer.py: layer_step, the reference
PACKED = "onednn-packed"  # kernels/packed_linear.py: oneDNN on weights packed once (CPU, 2+ rows)
TORCH = "torch"  # F.linear / the torch reference kernels
SCRIPTED = "scripted"  # a TorchScript call of the same ops as the drafter's modules
MODULES = "modules"  # the model's own nn.Modules, the reference
NATIVE_C = "native-c"  # kernels/native/lilicorr_head.c (one greedy fp32 row)
TRITON = "triton"  # kernels/*_triton.py: top-K + log-softmax, lattice match + walk
GRAPHED = "graphed-steps"  # engine/cuda_graphs.py
OFF = "off"
NONE = "none"


class BackendUnavailable(RuntimeError):
    """engine.backend=fast asked for a path that cannot run here. The message names it, why, and the fix."""


@dataclass(frozen=True)
class BackendPlan:
    backend: str  # engine.backend as asked
    device: str  # the target's device and dtype, e.g. "cpu float32"
    target_one_row: str  # the target's step of one row's one token (batch-1 decoding): its layers
    target_steps: str  # every other target step (verification, batched decoding, prefill)
    linear: str  # the target's and the drafter's projections at 2+ rows
    lm_head: str  # the target's LM head: one row, then 2+ rows where they differ
    drafter: str  # the drafter's block and context: its form and dtype, e.g. "scripted bfloat16"
    head: str  # the spec head's proposal: one row, then 2+ rows where they differ
    kernels: str  # top-K + log-softmax and the lattice walk outside the head's own pass
    tree: str  # DDTree's best-first builder (ddtree only)
    cuda_graphs: str
    notes: tuple[str, ...] = ()  # where a lever's path does not run, and why
    draft_vocab: str = ""  # the tokens the drafter proposes from: "full V", "N trained", "N of V run-time"
    one_row_linear: str = TORCH  # the target's projections and LM head at one row (engine.cpu_one_row)
    # the timing that chose one_row_linear (engine.cpu_one_row=measure), e.g.
    # "packed 4.10 ms, torch 9.80 ms a row through 7 weights"; "" where nothing was timed
    one_row_measured: str = ""

    @property
    def one_row_packed(self) -> bool:
        return self.one_row_linear == PACKED

    @property
    def drafter_scripted(self) -> bool:
        return self.drafter.startswith(SCRIPTED)

    @property
    def head_native(self) -> bool:
        """The LiLiCorr head's one greedy row through the C call."""
        return self.head.startswith(NATIVE_C)

    def record(self) -> dict[str, str]:
        """The flat dict the benches and the evaluation log: one string per computation, notes joined."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "notes"}
        out["notes"] = "; ".join(self.notes)
        return out


def _scripts(what: str) -> Optional[str]:
    """None where TorchScript scripts `what` ("stack", "drafter") in this process (once, then cached),
    else the problem."""
    from lilicorr.models import drafter_fast

    from . import scripted_stack

    ok = {"stack": scripted_stack.available, "drafter": drafter_fast.available}
    return None if ok[what]() else f"TorchScript cannot script the {what} here"


class _Chooser:
    """Picks per computation: the lever's path where it runs, else the next one down (auto) or an error (fast)."""

    def __init__(self, backend: str):
        self.backend, self.notes = backend, []

    def pick(self, what: str, lever: Optional[str], asked: bool, problem: Callable[[], Optional[str]], fast: str,
             fallback: str) -> str:
        """`fast` if `asked` (its lever is on and it applies to this device and dtype) and `problem()` finds
        nothing that keeps it from running (asked only then: it may script or build), else `fallback`.
        lever None: a path without one (it runs wherever it applies)."""
        if self.backend == "reference" or not asked:
            return fallback
        problem = problem()
        if problem is None:
            return fast
        if self.backend == "fast":
            off = f"set {lever}=false to run {fallback}, or " if lever else ""
            raise BackendUnavailable(
                f"engine.backend=fast: the {what} cannot run {fast} here ({problem}). Fix that, or {off}set "
                f"engine.backend=auto to run {fallback} with a note")
        self.notes.append(f"{what}: {fallback}, not {fast} ({problem})")
        return fallback


def resolve(cfg: EngineConfig, device: torch.device, dtype: torch.dtype, head=None, drafter_dtype=None,
            tree: bool = False, draft_vocab: str = "", one_row_weights: Sequence[torch.Tensor] = ()) -> BackendPlan:
    """The plan of a decoder whose target runs on `device` in `dtype`, with `head` (None: AR) and a drafter in
    `drafter_dtype`; tree: the system is DDTree; draft_vocab: what the drafter proposes from (recorded only);
    one_row_weights: the target's weights that engine.cpu_one_row=measure times (its LM head and one layer's).
    Raises BackendUnavailable (engine.backend=fast) or ValueError."""
    if cfg.backend not in typing.get_args(EngineBackend):  # an EngineConfig built in code skips load_config's check
        raise ValueError(f"engine.backend={cfg.backend!r}: one of {', '.join(typing.get_args(EngineBackend))}")
    c = _Chooser(cfg.backend)
    cpu, fp32 = device.type == "cpu", dtype == torch.float32
    fp32_cpu = cpu and fp32

    def no_onednn() -> Optional[str]:
        return None if torch.backends.mkldnn.is_available() else "this PyTorch has no oneDNN"

    linear = c.pick("projections", "engine.cpu_prepack", cfg.cpu_prepack and fp32_cpu, no_onednn, PACKED, TORCH)
    steps = c.pick("target's steps", "engine.cpu_script_layers", cfg.cpu_script_layers and fp32_cpu,
                   lambda: _scripts("stack"), SCRIPTED_STACK, EAGER_LAYERS)
    one_row = steps  # the same layers; their projections at one row are F.linear's (kernels/linear.py)
    one_row_linear, one_row_measured = _one_row_linear(cfg, linear, one_row_weights)
    lm_head = linear if one_row_linear == linear else f"{one_row_linear} (1 row), {linear} (2+ rows)"
    kernels = _kernels(c, cfg, device)
    drafter = head_path = NONE
    if head is not None:
        drafter = _drafter(c, cpu, drafter_dtype or dtype)
        head_path = _head(c, cfg, cpu, fp32, head)
    tree_path = "eager" if tree else NONE  # its TorchScript form measured < 1% of a block: deleted
    # captured on first use; a failed capture warns and runs eagerly (cuda_graphs.py): engine.cuda_graphs=false
    # is the way to ask for no graphs
    graphs = c.pick("CUDA graphs", "engine.cuda_graphs", cfg.cuda_graphs and device.type == "cuda", lambda: None,
                    GRAPHED, OFF)
    plan = BackendPlan(cfg.backend, f"{device.type} {str(dtype).removeprefix('torch.')}", one_row, steps, linear,
                       lm_head, drafter, head_path, kernels, tree_path, graphs, tuple(c.notes), draft_vocab,
                       one_row_linear, one_row_measured)
    log.info("engine backend: %s", plan.record())
    return plan


# engine.cpu_one_row=measure: the choice per target (its LM head's address and shape), made once per process so
# that the decoders a bench or a server builds side by side on one target all take the same path
_ONE_ROW_MEASURED: dict[tuple, tuple[str, str]] = {}


def _one_row_linear(cfg: EngineConfig, linear: str, weights: Sequence[torch.Tensor]) -> tuple[str, str]:
    """The one-row projections' path (F.linear unless the 2+ row ones are packed, then as engine.cpu_one_row says)
    and the timing that chose it ("" where none did)."""
    if linear != PACKED or cfg.cpu_one_row == "plain":
        return TORCH, ""
    if cfg.cpu_one_row == "packed":
        return PACKED, ""
    if cfg.cpu_one_row != "measure":  # an EngineConfig built in code skips load_config's check
        raise ValueError(f"engine.cpu_one_row={cfg.cpu_one_row!r}: one of {', '.join(typing.get_args(CpuOneRow))}")
    # keyed by the first weight, the LM head: building a TargetForward re-lays the layers' q/k/v and gate/up
    key = (weights[0].data_ptr(), tuple(weights[0].shape)) if weights else ()
    if key not in _ONE_ROW_MEASURED:
        from lilicorr.kernels.linear import time_one_row

        plain, packed, timed = time_one_row(weights)
        if not timed:  # nothing large enough to pack: the packed copies do not exist
            _ONE_ROW_MEASURED[key] = TORCH, ""
        else:
            _ONE_ROW_MEASURED[key] = (PACKED if packed < plain else TORCH,
                                      f"packed {packed * 1e3:.2f} ms, torch {plain * 1e3:.2f} ms a row through "
                                      f"{timed} weights")
    return _ONE_ROW_MEASURED[key]


def _kernels(c: _Chooser, cfg: EngineConfig, device: torch.device) -> str:
    from lilicorr.kernels.dispatch import interpret_mode, triton_available

    where = device.type == "cuda" or (device.type == "cpu" and interpret_mode())
    return c.pick("top-K and walk kernels", "engine.use_triton", cfg.use_triton and where,
                  lambda: None if triton_available() else "triton is not installed", TRITON, TORCH)


def _drafter(c: _Chooser, cpu: bool, dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    # no lever: the scripted form runs wherever it applies (CPU inference in fp32 or bf16), modules elsewhere
    form = c.pick("drafter", None, cpu and dtype in (torch.float32, torch.bfloat16), lambda: _scripts("drafter"),
                  SCRIPTED, MODULES)
    return f"{form} {name}"


def _head(c: _Chooser, cfg: EngineConfig, cpu: bool, fp32: bool, head) -> str:
    """The spec head's proposal: a greedy LiLiCorr head's one fp32 CPU row through the C call
    (models/heads/lilicorr_native.py, given the decoder's HeadInference: engine/drafting.py), every other proposal
    through the head's modules."""
    from lilicorr.models.heads.lilicorr import LiLiCorrHead

    if not isinstance(head, LiLiCorrHead) or not cpu or head.cfg.decode_rule != "greedy":
        return MODULES

    def no_native() -> Optional[str]:  # builds the C kernel once (a ~1 s compile)
        from lilicorr.models.heads import lilicorr_native
        return None if lilicorr_native.available() else "no C compiler, or its build failed"

    one = c.pick("head's one-row proposal", "engine.cpu_native_head", cfg.cpu_native_head and fp32, no_native,
                 NATIVE_C, MODULES)
    return one if one == MODULES else f"{one} (1 row), {MODULES} (2+ rows)"
