"""Systems by name, and the one builder that turns (config, target, system, checkpoint) into a Decoder.

| system            | drafter | head (head.kind) | decode / proposal                      |
|-------------------|---------|------------------|----------------------------------------|
| ar                | -       | -                | the target alone (the baseline)        |
| dflash            | DFlash  | none             | per-slot argmax                        |
| lilicorr          | DFlash  | lilicorr         | greedy walk (Eq. 8); also "+ margin" checkpoints |
| lilicorr-viterbi  | DFlash  | lilicorr         | Viterbi (App. E)                       |
| domino            | DFlash  | domino           | sequential correction                  |
| dspark            | DFlash  | dspark           | deterministic proposal, confidence cut |
| dspark-sampled    | DFlash  | dspark           | sampled proposal (q returned) at T > 0 |
| ddtree            | DFlash  | none             | best-first tree over top-k marginals (ddtree.py) |

"LiLiCorr + margin" is the lilicorr system with a checkpoint trained with loss.mu > 0;
"lilicorr-margin" is accepted as an alias so result tables can name it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterable, Optional

from lilicorr.config import Config

# Torch-free at import: a job can reject an unknown system name before loading anything heavy.


@dataclass(frozen=True)
class System:
    name: str
    head_kind: Optional[str]  # None = autoregressive
    decode_rule: Optional[str] = None  # lilicorr only
    proposal: Optional[str] = None  # dspark only


SYSTEMS = {s.name: s for s in [
    System("ar", None),
    System("dflash", "none"),
    System("lilicorr", "lilicorr", decode_rule="greedy"),
    System("lilicorr-margin", "lilicorr", decode_rule="greedy"),
    System("lilicorr-viterbi", "lilicorr", decode_rule="viterbi"),
    System("domino", "domino"),
    System("dspark", "dspark", proposal="deterministic"),
    System("dspark-sampled", "dspark", proposal="sampled"),
    System("ddtree", "none"),  # training-free: a DFlash export, its proposal a tree (engine/ddtree.py)
]}


class UnknownSystemOrCheckpoint(ValueError):
    """An unknown system, or a checkpoint that does not fit the system or the target."""


def get_system(name: str) -> System:
    if name not in SYSTEMS:
        raise UnknownSystemOrCheckpoint(f"unknown system {name!r}; known systems: {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def _apply_system(cfg: Config, system: System) -> Config:
    cfg = copy.deepcopy(cfg)
    cfg.head.kind = system.head_kind
    if system.decode_rule:
        cfg.head.decode_rule = system.decode_rule
    if system.proposal:
        cfg.head.dspark_proposal = system.proposal
    return cfg


def load_draft_model(cfg: Config, hf_model, system: System, checkpoint: Optional[str] = None):
    """(drafter, head, capture_ids) for a speculative system: from an exported checkpoint, or random."""
    import torch

    from lilicorr.models.drafter_init import build_drafter
    from lilicorr.models.heads import build_head
    from lilicorr.models.target import TargetAdapter, drafter_capture_ids

    if checkpoint:
        from lilicorr.models.export import ExportMissing, read_meta
        from lilicorr.models.joint import load_drafter_and_head

        try:
            meta = read_meta(checkpoint)
        except ExportMissing:
            raise UnknownSystemOrCheckpoint(f"checkpoint {checkpoint!r} has no config.json (expected a JointModel export)") from None
        except ValueError as e:
            raise UnknownSystemOrCheckpoint(f"checkpoint {checkpoint!r}: {e}") from None
        kind = meta.head_kind
        if kind != system.head_kind:
            raise UnknownSystemOrCheckpoint(f"checkpoint {checkpoint!r} holds head {kind!r}, system {system.name!r} needs "
                               f"{system.head_kind!r}")
        adapter = TargetAdapter(hf_model, meta.capture_ids)
        try:  # the system's choices (decode rule, proposal contract) go into the head as it is built
            drafter, head, _ = load_drafter_and_head(checkpoint, adapter, adjust=lambda c: _apply_system(c, system))
        except (RuntimeError, ValueError, KeyError) as e:
            raise UnknownSystemOrCheckpoint(f"checkpoint {checkpoint!r} does not fit the target "
                               f"({type(hf_model).__name__}, hidden {hf_model.config.hidden_size}, "
                               f"vocab {hf_model.config.vocab_size}): {e}") from None
    else:
        run_cfg = _apply_system(cfg, system)
        adapter = TargetAdapter(hf_model, drafter_capture_ids(hf_model.config, run_cfg.drafter))
        fork_devices: list = []
        with torch.random.fork_rng(devices=fork_devices):  # a seeded random drafter, caller's RNG untouched
            torch.manual_seed(run_cfg.engine.seed)
            drafter = build_drafter(run_cfg.drafter, adapter)
            head = build_head(run_cfg, adapter, drafter)
    param = next(hf_model.parameters())
    drafter = drafter.to(device=param.device, dtype=drafter_dtype(cfg, param)).eval()
    head = head.to(device=param.device, dtype=param.dtype).eval()
    return drafter, head, list(adapter.capture_ids)


def drafter_dtype(cfg: Config, target_param):
    """The drafter's inference dtype: the target's, or bf16 for an fp32 CPU target with engine.cpu_drafter_bf16
    where oneDNN has native bf16 (else the flag is ignored: emulated bf16 is slower than fp32)."""
    import torch

    from lilicorr.kernels.packed_linear import bf16_supported

    if (cfg.engine.cpu_drafter_bf16 and target_param.device.type == "cpu" and target_param.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and bf16_supported()):
        return torch.bfloat16
    return target_param.dtype


@dataclass
class DecoderParts:
    """What a Decoder is built from, loaded but without its caches: a caller can size them first."""

    target: object  # TargetForward
    drafter: object = None
    head: object = None
    nodes: int = 1  # nodes of one verification pass (runner.verified_nodes)
    plan: object = None  # backend.BackendPlan: which implementation runs each computation

    def cache_bytes_per_slot(self, max_len: int) -> int:
        """K/V bytes one slot of this system's Decoder allocates at max_seq_len=max_len: the target's cache and
        the drafter's context cache, each max_len + slack positions (slack = block + 1, as runner.py sizes it)."""
        from .kv_cache import cache_bytes

        t = self.target
        positions = max_len + self.nodes + 1
        total = cache_bytes(t.num_layers, t.num_kv_heads, t.head_dim, t.dtype.itemsize, 1, positions)
        if self.drafter is not None:
            s = self.drafter.shape
            dtype = next(self.drafter.parameters()).dtype
            total += cache_bytes(s.num_layers, s.num_kv_heads, s.head_dim, dtype.itemsize, 1, positions)
        return total


def decoder_parts(cfg: Config, hf_model, system_name: str, checkpoint: Optional[str] = None) -> DecoderParts:
    """Target forward, drafter and head of `system_name` on `hf_model` (checkpoint=None: random drafter + head),
    and the plan of which implementation runs each computation (engine/backend.py), resolved here once."""
    from lilicorr.models.vocab_ranking import apply_run_time_vocab

    from . import backend

    system = get_system(system_name)
    param = next(hf_model.parameters())
    if system.head_kind is None:
        if checkpoint:
            raise UnknownSystemOrCheckpoint(f"system 'ar' takes no checkpoint (got {checkpoint!r})")
        plan = backend.resolve(cfg.engine, param.device, param.dtype, one_row_weights=_one_row_weights(hf_model))
        return DecoderParts(_target_forward(plan, hf_model, None), plan=plan)
    drafter, head, capture_ids = load_draft_model(cfg, hf_model, system, checkpoint)
    vocab = apply_run_time_vocab(drafter, checkpoint, cfg.engine.draft_vocab)  # before anything reads draft_ids
    plan = backend.resolve(cfg.engine, param.device, param.dtype, head, next(drafter.parameters()).dtype,
                           tree=system.name == "ddtree", draft_vocab=vocab, one_row_weights=_one_row_weights(hf_model))
    if system.name == "ddtree":
        from .ddtree import tree_head
        head = tree_head(head, drafter.block_size, cfg.engine.ddtree_budget, cfg.engine.ddtree_top_k)
    from .runner import verified_nodes

    return DecoderParts(_target_forward(plan, hf_model, capture_ids), drafter, head,
                        verified_nodes(cfg.engine, drafter, head), plan)


def _target_forward(plan, hf_model, capture_ids):
    from . import backend
    from .target_forward import TargetForward

    return TargetForward(hf_model, capture_ids, prepack=plan.linear == backend.PACKED,
                         script_layers=plan.target_steps == backend.SCRIPTED_STACK, one_row_packed=plan.one_row_packed)


def _one_row_weights(hf_model) -> list:
    """What engine.cpu_one_row=measure times: the target's LM head and its first layer's projections (a batch-1
    step reads the LM head once and every layer's projections)."""
    import torch

    layer = hf_model.model.layers[0]
    return [hf_model.get_output_embeddings().weight.detach()] + [
        m.weight.detach() for m in layer.modules() if isinstance(m, torch.nn.Linear)]


def decoder_from_parts(parts: DecoderParts, cfg: Config, stop_ids: Iterable[int] = (), timing: bool = False,
                       max_batch: Optional[int] = None):
    from .decoder import Decoder

    return Decoder(parts.target, cfg.engine, drafter=parts.drafter, head=parts.head, stop_ids=stop_ids,
                   timing=timing, max_batch=max_batch, plan=parts.plan)


def build_decoder(cfg: Config, hf_model, system_name: str, checkpoint: Optional[str] = None,
                  stop_ids: Iterable[int] = (), timing: bool = False, max_batch: Optional[int] = None):
    """A Decoder for `system_name` on `hf_model` (checkpoint=None: a random, untrained drafter + head)."""
    return decoder_from_parts(decoder_parts(cfg, hf_model, system_name, checkpoint), cfg, stop_ids=stop_ids,
                              timing=timing, max_batch=max_batch)
