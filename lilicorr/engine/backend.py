"""Which implementation runs each computation of a decoder: chosen once, when the decoder is built.

`engine.backend` (config.py) says how the engine levers (`engine.cpu_*`, `engine.use_triton`,
`engine.cuda_graphs`) are read:
  auto       each computation takes the fast path its lever asks for where it can run on this device and
             dtype; one that cannot runs the next path down, and the plan's `notes` say which and why
  fast       the same choice, but a fast path a lever asks for that cannot run here raises BackendUnavailable
             naming the path, the reason and the fix, instead of falling back
  reference  what the engine can switch runs its reference: the eager layers, F.linear, the drafter's modules,
             the eager DDTree builder, the torch kernels, no CUDA graphs (readable code, for parity checks)

`resolve` returns a frozen BackendPlan naming, per computation, the implementation that runs, and logs it
(logger lilicorr.engine.backend, INFO); systems.py builds the decoder from it (TargetForward's switches, the
head's one-row paths, the drafter's form, the runner's CUDA graphs), and `record()` is what
`jobs/bench.py stages` and `jobs/evaluate.py` write beside their figures. Paths compiled on first call (Inductor) are checked here for what they need (a C++
compiler); one that still fails to compile warns and runs the eager path, as before this module existed.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lilicorr.config import EngineConfig
from lilicorr.config_choices import EngineBackend

log = logging.getLogger(__name__)

# Implementation names: what each field of a BackendPlan may hold
COMPILED_LAYER = "compiled-layer"  # engine/one_row_layer.py: a decoder layer as one Inductor call
SCRIPTED_STACK = "scripted-stack"  # engine/scripted_stack.py: every layer in one TorchScript call
EAGER_LAYERS = "eager-layers"  # engine/layer.py: layer_step, the reference
PACKED = "onednn-packed"  # kernels/packed_linear.py: oneDNN on weights packed once (CPU, 2+ rows)
TORCH = "torch"  # F.linear / the torch reference kernels
COMPILED_GEMV = "compiled-gemv"  # kernels/gemv.py (one row)
SCRIPTED = "scripted"  # a TorchScript call of the same ops as the modules (drafter, head, DDTree builder)
MODULES = "modules"  # the model's own nn.Modules, the reference
NATIVE_C = "native-c"  # kernels/native/lilicorr_head.c (one greedy fp32 row)
COMPILED = "compiled"  # models/heads/lilicorr_fast.py's Inductor call (one greedy row)
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
    target_one_row: str  # the target's step of one row's one token (batch-1 decoding)
    target_steps: str  # every other target step (verification, batched decoding, prefill)
    linear: str  # the target's and the drafter's projections at 2+ rows
    lm_head: str  # the target's LM head: one row, then 2+ rows where they differ
    drafter: str  # the drafter's block and context: its form and dtype, e.g. "scripted bfloat16"
    head: str  # the spec head's proposal: one row, then 2+ rows where they differ
    kernels: str  # top-K + log-softmax and the lattice walk outside the head's own pass
    tree: str  # DDTree's best-first builder (ddtree only)
    cuda_graphs: str
    notes: tuple[str, ...] = ()  # where a lever's path does not run, and why

    @property
    def drafter_scripted(self) -> bool:
        return self.drafter.startswith(SCRIPTED)

    def record(self) -> dict[str, str]:
        """The flat dict the benches and the evaluation log: one string per computation, notes joined."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "notes"}
        out["notes"] = "; ".join(self.notes)
        return out


def _cpp_compiler() -> Optional[str]:
    """The C++ compiler Inductor would use on CPU, or None (then a compiled path cannot build here)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # noqa: BLE001 - no compiler found raises, its type varies across torch versions
        return None


def _scripts(what: str) -> Optional[str]:
    """None where TorchScript scripts `what` ("stack", "drafter", "tree") in this process (once, then cached),
    else the problem."""
    from lilicorr.models import drafter_fast

    from . import ddtree, scripted_stack

    ok = {"stack": scripted_stack.available, "drafter": drafter_fast.available, "tree": ddtree.scripted_available}
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
            tree: bool = False) -> BackendPlan:
    """The plan of a decoder whose target runs on `device` in `dtype`, with `head` (None: AR) and a drafter in
    `drafter_dtype`; tree: the system is DDTree. Raises BackendUnavailable (engine.backend=fast) or ValueError."""
    if cfg.backend not in typing.get_args(EngineBackend):  # an EngineConfig built in code skips load_config's check
        raise ValueError(f"engine.backend={cfg.backend!r}: one of {', '.join(typing.get_args(EngineBackend))}")
    c = _Chooser(cfg.backend)
    cpu, fp32 = device.type == "cpu", dtype == torch.float32
    fp32_cpu = cpu and fp32
    def no_cxx() -> Optional[str]:
        return None if _cpp_compiler() else "no C++ compiler for Inductor"

    def no_onednn() -> Optional[str]:
        return None if torch.backends.mkldnn.is_available() else "this PyTorch has no oneDNN"

    linear = c.pick("projections", "engine.cpu_prepack", cfg.cpu_prepack and fp32_cpu, no_onednn, PACKED, TORCH)
    steps = c.pick("target's steps", "engine.cpu_script_layers", cfg.cpu_script_layers and fp32_cpu,
                   lambda: _scripts("stack"), SCRIPTED_STACK, EAGER_LAYERS)
    one_row = c.pick("target's one-row step", "engine.cpu_gemv", cfg.cpu_gemv and fp32_cpu, no_cxx, COMPILED_LAYER,
                     steps)
    lm_head = f"{COMPILED_GEMV} (1 row), {linear} (2+ rows)" if one_row == COMPILED_LAYER else linear
    kernels = _kernels(c, cfg, device)
    drafter = head_path = NONE
    if head is not None:
        drafter = _drafter(c, cpu, drafter_dtype or dtype)
        head_path = _head(c, cfg, cpu, fp32, head, linear == PACKED, no_cxx)
    tree_path = NONE
    if tree:
        tree_path = c.pick("DDTree builder", None, cpu, lambda: _scripts("tree"), SCRIPTED, "eager")
    # captured on first use; a failed capture warns and runs eagerly (cuda_graphs.py): engine.cuda_graphs=false
    # is the way to ask for no graphs
    graphs = c.pick("CUDA graphs", "engine.cuda_graphs", cfg.cuda_graphs and device.type == "cuda", lambda: None,
                    GRAPHED, OFF)
    plan = BackendPlan(cfg.backend, f"{device.type} {str(dtype).removeprefix('torch.')}", one_row, steps, linear,
                       lm_head, drafter, head_path, kernels, tree_path, graphs, tuple(c.notes))
    log.info("engine backend: %s", plan.record())
    return plan


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


def _head(c: _Chooser, cfg: EngineConfig, cpu: bool, fp32: bool, head, packed: bool, no_cxx: Callable) -> str:
    """The spec head's proposal: the LiLiCorr head's paths (models/heads/lilicorr.py propose), or its modules."""
    if not hasattr(head, "compile_one_row") or not cpu:
        return MODULES
    from lilicorr.kernels.packed_linear import worth_packing
    from lilicorr.models.heads import lilicorr_fast

    # The runner packs the head's large Linears with the target's (drafting.py), and a packed head runs its modules
    packs = packed and any(type(m) is torch.nn.Linear and worth_packing(m.weight) for m in head.modules())
    rows = MODULES if packs or not lilicorr_fast.available() else SCRIPTED
    if c.backend == "reference" and rows == SCRIPTED:  # the head reads lilicorr_fast.SCRIPTED, a process-wide flag
        c.notes.append("head: scripted (TorchScript, the modules' ops) also under engine.backend=reference")
    if head.cfg.decode_rule != "greedy":
        return rows
    compiled = c.pick("head's one-row proposal", "engine.cpu_compile_head", cfg.cpu_compile_head, no_cxx,
                      COMPILED, rows)

    def no_native() -> Optional[str]:  # builds the C kernel once (a ~1 s compile)
        from lilicorr.models.heads import lilicorr_native
        return None if lilicorr_native.available() else "no C compiler, or its build failed"

    one = c.pick("head's one-row proposal", "engine.cpu_native_head", cfg.cpu_native_head and fp32, no_native,
                 NATIVE_C, compiled)
    return one if one == rows else f"{one} (1 row), {rows} (2+ rows)"
