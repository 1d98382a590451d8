"""What a replica serves: systems -> drafter checkpoints -> running engine threads over one shared target.

A speculative system uses, in order: the checkpoint given for it (`--checkpoint DIR`, or `SYSTEM=DIR`; DIR may
be an MLflow `models:/NAME@ALIAS` URI), the shipped one (`lilicorr.platform.shipped`: lilicorr-viterbi reads
lilicorr's; lilicorr-margin has none, it needs a μ > 0 run), or a random untrained drafter when
`drafter="random"`; with none of these it is left out (and said so). Every model shares the one target's
weights; each has its own decoder (KV cache) and engine thread. Model names are `<preset>-<system>`.

Device: the target and every drafter go on the replica's GPU when it reserves one (`num_gpus > 0`, set by
deployment.application) and CUDA is there, or where `device` says; the CPU otherwise. The engine follows
the target's parameters (caches, graphs, kernels). The systems' static caches share `engine.kv_cache_gb`
(kv_budget.py): they are sized after every drafter is loaded and before any cache is allocated.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from lilicorr.config import load_config
from lilicorr.config.paths import REPO_ROOT

from .metrics import NULL_METRICS

log = logging.getLogger("lilicorr.serve")


@dataclass
class ServeSpec:
    """Everything a replica needs to build its models (plain data: it travels to the Ray actor)."""

    preset: str = "smollm2-135m"
    overrides: list[str] = field(default_factory=list)
    systems: list[str] = field(default_factory=lambda: ["lilicorr", "dflash", "ar"])
    checkpoints: list[str] = field(default_factory=list)  # "DIR" or "SYSTEM=DIR"
    drafter: Optional[str] = None  # "random": untrained drafters where no checkpoint is found
    api_key_env: str = "LILICORR_API_KEY"  # read in the replica; unset or empty = no key
    checkpoint_root: str = str(REPO_ROOT / "checkpoints")
    warmup: bool = True
    torch_threads: Optional[int] = None  # None = the node's cores, at most 8 (Ray would otherwise set 1)
    device: Optional[str] = None  # "cuda" | "cpu" | None = cuda when the replica reserves a GPU (num_gpus > 0)
    num_gpus: float = 0  # GPUs the replica reserves (deployment.application sets it from its sizing)


def _head_kind(path: str) -> Optional[str]:
    from lilicorr.models.export import ExportMissing, read_meta

    try:
        return read_meta(path).head_kind
    except ExportMissing:
        raise ValueError(f"checkpoint {path!r} has no config.json (expected a jobs/train.py export)") from None


def resolve_checkpoints(spec: ServeSpec) -> dict[str, Optional[str]]:
    """{system: checkpoint folder or None (AR, or a random drafter)} for the systems that can be served."""
    from lilicorr.engine.systems import get_system

    from lilicorr.platform.shipped import shipped_checkpoint
    from lilicorr.platform.tracking import is_model_uri, resolve_checkpoint

    explicit: dict[str, str] = {}
    loose: list[str] = []
    for item in spec.checkpoints:
        name, sep, path = item.partition("=")
        if not (sep and not os.path.isdir(item) and not is_model_uri(item)):
            name, path = "", item
        if is_model_uri(path):  # models:/NAME@ALIAS or runs:/..., downloaded once into the cache
            path = resolve_checkpoint(path)[0]
        if not os.path.isdir(path):
            raise ValueError(f"checkpoint {path!r} is not a folder")
        if name:
            explicit[name] = path
        else:
            loose.append(path)
    out: dict[str, Optional[str]] = {}
    for name in spec.systems:
        system = get_system(name)  # raises for an unknown name
        if system.head_kind is None:
            out[name] = None
            continue
        ckpt = (explicit.get(name) or next((p for p in loose if _head_kind(p) == system.head_kind), None)
                or shipped_checkpoint(spec.preset, name, Path(spec.checkpoint_root)))
        if ckpt is None and spec.drafter != "random":
            log.warning("system %s: no checkpoint given or shipped at %s, and no --drafter random: not served",
                        name, Path(spec.checkpoint_root) / spec.preset)
            continue
        out[name] = ckpt
    if not out:
        raise ValueError(f"none of the systems {spec.systems} can be served: give --checkpoint DIR or "
                         f"--drafter random, or add 'ar'")
    return out


def replica_device(device: Optional[str], num_gpus: float, cuda_available: bool) -> str:
    """Where a replica's models go: `device` when given, else cuda iff the replica reserves a GPU.

    A replica that reserves a GPU but sees no CUDA (a CPU build of torch, no driver) is refused, not run
    on the CPU: that silent fallback is how a GPU deployment ends up serving at CPU speed.
    """
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"serve device {device!r}: use 'cuda', 'cpu' or leave it unset")
    want = device or ("cuda" if num_gpus > 0 else "cpu")
    if want == "cuda" and not cuda_available:
        raise RuntimeError(f"the replica should run on cuda (device={device!r}, num_gpus={num_gpus}) but "
                           f"torch.cuda.is_available() is False: check the image's torch build and the driver, "
                           f"or serve with num_gpus=0")
    return want


def load_state(spec: ServeSpec, metrics=NULL_METRICS):
    """Load the target once, build and start one engine thread per system; the app's ServerState."""
    import torch

    from lilicorr.engine.systems import decoder_from_parts, decoder_parts
    from lilicorr.engine.threaded import EngineThread, TorchThread
    from lilicorr.platform.assets import eos_token_ids, load_target

    from .app import ServerState
    from .generation import ServedModel
    from .kv_budget import fit_slots

    # The decoders' steps run on one TorchThread at the replica's intra-op threads; this (loading) thread loads at
    # one, so that no second thread of the process opens parallel regions (engine/threaded.py says why), and gets
    # its own count back after (a caller's thread, e.g. a test's, keeps what it had).
    torch_thread = TorchThread(spec.torch_threads or max(1, min(8, os.cpu_count() or 1)))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    models: dict[str, ServedModel] = {}
    try:
        cfg = load_config(spec.preset, spec.overrides)
        plan = resolve_checkpoints(spec)
        device = replica_device(spec.device, spec.num_gpus, torch.cuda.is_available())
        hf_model, tokenizer = load_target(cfg.target)
        hf_model.to(device)  # drafters follow the target's parameters (engine/systems.py load_draft_model)
        stops = eos_token_ids(cfg.target, tokenizer)
        parts = {system: decoder_parts(cfg, hf_model, system, checkpoint=ckpt) for system, ckpt in plan.items()}
        per_slot = {system: p.cache_bytes_per_slot(cfg.engine.max_seq_len) for system, p in parts.items()}
        slots = fit_slots(per_slot, cfg.engine.kv_cache_gb, cfg.engine.max_batch_size, cfg.engine.max_seq_len)
        log.info("serving on %s: %d slots per system x %d tokens, K/V caches %.2f GiB in all (engine.kv_cache_gb=%s)",
                 device, slots, cfg.engine.max_seq_len, slots * sum(per_slot.values()) / 2 ** 30,
                 cfg.engine.kv_cache_gb)
        for system, ckpt in plan.items():
            decoder = decoder_from_parts(parts.pop(system), cfg, stop_ids=stops, max_batch=slots)
            if spec.warmup:
                torch_thread.run(decoder.warmup)
            engine = EngineThread(decoder, torch_thread=torch_thread)
            engine.start()
            name = f"{spec.preset}-{system}"
            models[name] = ServedModel(name, engine, cfg.engine.max_seq_len, decoder.target.vocab_size)
            log.info("serving %s (%s)", name, ckpt or ("random drafter" if system != "ar" else "target only"))
    except BaseException:
        stop_all(models)  # the engine threads already started
        raise
    finally:
        torch.set_num_threads(before)
    key = os.environ.get(spec.api_key_env) or None
    return ServerState(models, tokenizer, cfg.target.enable_thinking, key, metrics)


def stop_all(models) -> None:
    for m in models.values():
        try:
            m.engine.stop()
        except Exception:  # shutting down: keep stopping the others
            log.exception("stopping %s", m.name)
